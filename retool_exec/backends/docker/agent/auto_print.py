"""A call's final expression printed, as a REPL shows it (``Sandbox(auto_print=True)``).

Done where the code runs, in the call's own process, under its deadline and its
memory limit: the host never parses model-written code. When it did (eleventh
red-team round), 2 MB of code held the caller 18 s and 2.4 GB for a call with a
one-second timeout. The local backend runs this same file in its child.

Python 3.9 compatible, standard library only, and no ``from __future__`` import
here: ``compile`` below passes ``dont_inherit`` anyway, so the code gets no
compiler flag of ours. The zygote imports this module before it forks (a call
cannot read the agent's files); ``ast`` is imported only by a call that asks,
so no zygote holds it for the calls that do not.
"""

import os
import types

TYPE_CHECKING = False  # typing itself is not imported into a zygote for this
if TYPE_CHECKING:
    import ast

__all__ = ["WRAPPER", "compile_auto_printed", "is_print_call", "stdlib_ast"]

WRAPPER = "(lambda __retool_value: __retool_value is None or print(__retool_value))"
"""What the final expression's value is passed to: ``None`` is not printed, as in a REPL.
``add_auto_print`` (the host-side rewrite a user may call) wraps the text in the same."""


def compile_auto_printed(source: str, filename: str) -> types.CodeType:
    """``source`` compiled as ``compile(source, filename, "exec")`` would, but with its last
    top-level statement, if it is an expression other than a ``print(...)`` call, printing
    its value. The wrapper takes the expression's position, so tracebacks keep true lines.
    Code the AST route cannot take (nested deeper than its recursion allows, or too large
    for memory) is compiled as written, as ``add_auto_print`` leaves it unchanged."""
    ast = stdlib_ast()
    try:
        tree = ast.parse(source, filename, "exec")
        last = tree.body[-1] if tree.body else None
        if (
            isinstance(last, ast.Expr)
            and not isinstance(last.value, ast.Starred)  # `*a` alone is a SyntaxError
            and not is_print_call(last.value)
        ):
            wrapper = ast.parse(WRAPPER, filename, "eval").body
            call = ast.Call(func=wrapper, args=[last.value], keywords=[])
            for node in ast.walk(wrapper):
                ast.copy_location(node, last.value)
            last.value = ast.copy_location(call, last.value)
        return compile(tree, filename, "exec", dont_inherit=True)
    except (RecursionError, MemoryError):
        tree = None  # free it before compiling again
    return compile(source, filename, "exec", dont_inherit=True)


class _Stdlib:
    ast: "types.ModuleType | None" = None
    """The standard library's ``ast`` as ``stdlib_ast`` first found it."""


def stdlib_ast() -> types.ModuleType:
    """The standard library's ``ast``, never a file of the call's working directory (which
    may be first on ``sys.path``) nor a module the code put in ``sys.modules``: imported
    with the working directory off the path, or taken from ``sys.modules`` before any
    code ran, then kept (a notebook's later cells are parsed by it, whatever the code did
    to ``sys.modules`` meanwhile)."""
    if _Stdlib.ast is None:
        import sys

        if "ast" not in sys.modules:
            saved = sys.path[:]
            sys.path[:] = [
                entry for entry in sys.path if entry not in ("", ".") and entry != os.getcwd()
            ]
            try:
                import ast  # noqa: F401
            finally:
                sys.path[:] = saved
        _Stdlib.ast = sys.modules["ast"]
    return _Stdlib.ast


def is_print_call(node: "ast.expr") -> bool:
    """Whether ``node`` is a ``print(...)`` call (its value is printed already)."""
    ast = stdlib_ast()
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
    )
