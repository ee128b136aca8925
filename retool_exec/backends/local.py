"""The seed's local executor: a fresh ``python -B`` process per call.

**This is NOT a security boundary.** The code runs as the host user, sees the
host's environment (secrets included), files and network, and can use all
memory. It exists to compare against and for trusted code; use the Docker
backend for anything a model wrote.

It keeps the seed's behaviour for ordinary code (RLIMIT_CPU = int(timeout)+5,
wall-clock timeout, new session, ``<sandbox>`` filename, ``__main__``
namespace, tail-capped output, the four thread variables) and fixes what the
seed gets wrong:

- the whole process group is SIGKILLed on every path (normal exit, error,
  timeout, cancellation), not only on timeout;
- output is drained from pipes while it is produced and only a bounded tail
  is kept, so a flood can neither block the child, fill the disk nor grow the
  host's memory (the seed wrote it to temporary files of unbounded size);
- the code travels over stdin, not argv, so 10 MB of code does not hit the
  kernel's argument-size limit (the seed raised ``OSError: E2BIG``);
- a background process that keeps the pipes open cannot hold the call open.

A request's inputs and outputs other than the code are handled by the host,
outside the child, so nothing the code prints can change them:

- ``stdin``: the child's stdin holds exactly those bytes (an unlinked
  temporary file); without it, stdin is ``/dev/null`` as before.
- ``files`` / ``fetch``: a fresh working directory, the child's cwd, is made
  for the call; the files are written into it before the child starts
  (every component created relative to its parent's descriptor,
  ``O_NOFOLLOW | O_EXCL``), and the fetched ones are read back after the
  child ended and its process group is dead (``O_NOFOLLOW`` on every
  component, non-blocking opens, regular files only, at most
  ``wire.MAX_FETCH_BYTES`` in all). Without files or fetch the child runs in
  the host's cwd, as in the seed.
- ``cells`` (notebook mode): one interpreter runs the cells in order in one
  ``__main__``. The host hands over one cell at a time on a socket, each with
  a fresh pair of stdout/stderr pipes (passed as descriptors) that the host
  reads for that cell alone; the child answers on the socket when the cell
  is over, with its displayed value or exception. ``cell_timeout`` sends
  SIGINT (a ``KeyboardInterrupt`` in the cell), then SIGKILLs the group after
  a second; the process ending in a cell ends the call, and that cell is
  reported unfinished. ``SystemExit`` in a cell is an error of that cell, as
  in IPython; ``os._exit`` ends the process.

Sessions (``open_session``; see docs/sessions.md) keep one such interpreter
per session, with the same cell protocol, between calls. Still NOT a security
boundary: a session is a host process of the host user.

- Each session is a ``python -B`` process in a new process group, with a
  working directory of its own (a temporary directory, its cwd), stdin
  ``/dev/null``, and descriptors 1 and 2 on ``/dev/null`` between cells.
  There is no CPU or memory limit (``memory_mb`` is ignored).
- A cell past its timeout gets SIGINT (``KeyboardInterrupt``); if it has not
  answered a second later, the group is SIGKILLed and the session is lost.
  The process ending (``os._exit``, a signal) loses the session; the result
  gives its exit status. A call cancelled while its cell runs kills the
  session too (its answer would arrive out of step).
- ``fork()`` copies the working directory first (``trees.copy_tree``, links
  copied as links, never followed; named pipes made anew; sockets left out),
  then sends "fork" with a new channel and the write end of a status pipe.
  The session forks twice: the first child exits at once (the session reaps
  it), so the copy is not its parent session's child; the middle process
  starts a new session, forks the copy (which starts a process group of its
  own, moves to the matching directory in the copy and says hello with its
  pid), then execs a small interpreter that waits for the copy and writes
  its wait status on the pipe: that is how the host learns how a fork ended,
  and the copy's snapshot is not pinned by a waiting twin.
- ``close()`` SIGKILLs the session's process group, waits until the process
  is gone (the host's child, or the waiter's report), and removes its
  working directory; the backend's ``close()`` (and the Sandbox's) closes
  every session still open. A process the code moved out of the group
  (``setsid``) is not found, as in one-shot calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import math
import os
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from typing import IO, Any, TypeGuard

from retool_exec._errors import SessionError, SessionLostError
from retool_exec._formatting import within
from retool_exec._models import CellResult, ExecResult, Outcome, classify_exit
from retool_exec._output import TailBuffer, read_cap_bytes
from retool_exec.backends.base import Backend, RunRequest, SessionHandle
from retool_exec.backends.config import LocalConfig
from retool_exec.backends.docker.agent import auto_print, trees, wire

__all__ = ["CHILD_ENV_OVERRIDES", "LocalSubprocessBackend"]

log = logging.getLogger(__name__)

CHILD_ENV_OVERRIDES = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
}
"""The seed's four variables: one numeric-library thread per sandboxed process."""

# Runs in the child. The code arrives on stdin (never in argv or a shell);
# stdin is then pointed at the request's stdin (an inherited descriptor) or
# /dev/null, and the helper removes itself from __main__ before the code runs,
# so the namespace is as clean as the seed's. Errors are printed without this
# bootstrap's own frame, so a traceback starts at File "<sandbox>" exactly as
# in the Docker backend.
_BOOTSTRAP = (
    "def _retool_boot():\n"
    "    import os, resource, sys\n"
    "    resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))\n"
    "    {stack}\n"
    "    source = sys.stdin.buffer.read()\n"
    "    {script}\n"
    "    fd = {stdin_fd}\n"
    "    if fd < 0:\n"
    "        fd = os.open(os.devnull, os.O_RDONLY)\n"
    "    os.dup2(fd, 0)\n"
    "    os.close(fd)\n"
    "    try:\n"
    "        text = source.decode('utf-8', 'surrogatepass')\n"
    "        {compile}\n"
    "    except Exception as exc:\n"
    "        sys.excepthook(type(exc), exc.with_traceback(None), None)\n"
    "        raise SystemExit(1) from None\n"
    "try:\n"
    "    exec(globals().pop('_retool_boot')())\n"
    "except SystemExit:\n"
    "    raise\n"
    "except BaseException as _retool_exc:\n"
    # The exceptions' C slots, as python3 reads them: a property of the code's class
    # (``__traceback__`` raising SystemExit(0)) made its failure a success.
    "    _retool_tb = BaseException.__dict__['__traceback__']\n"
    "    _retool_tb.__set__(_retool_exc, _retool_tb.__get__(_retool_exc).tb_next)\n"
    "    _retool_sys = __import__('sys')\n"
    "    _retool_type = type(_retool_exc)\n"
    "    _retool_hook = _retool_sys.__dict__.get('excepthook')\n"
    "    _retool_sys.last_type, _retool_sys.last_value = _retool_type, _retool_exc\n"
    "    _retool_sys.last_traceback = _retool_tb.__get__(_retool_exc)\n"  # as python3 sets them
    "    try:\n"
    "        _retool_sys.audit('sys.excepthook', _retool_hook, _retool_type, _retool_exc,\n"
    "            _retool_tb.__get__(_retool_exc))\n"
    "    except RuntimeError:\n"  # an audit hook refused it: python3 prints nothing
    "        raise SystemExit(1) from None\n"
    "    try:\n"
    "        if _retool_hook is None:\n"  # as python3 says it
    "            _retool_sys.stderr.write('sys.excepthook is missing\\n')\n"
    "            _retool_sys.excepthook = _retool_hook = _retool_sys.__excepthook__\n"
    "        _retool_hook(_retool_type, _retool_exc, _retool_tb.__get__(_retool_exc))\n"
    "    except SystemExit:\n"  # python3 exits with a hook's SystemExit, silently
    "        raise\n"
    "    except BaseException as _retool_hook:\n"  # as python3 reports a hook that raised
    "        _retool_tb.__set__(_retool_hook, _retool_tb.__get__(_retool_hook).tb_next)\n"
    "        _retool_context = BaseException.__dict__['__context__']\n"
    "        if _retool_context.__get__(_retool_hook) is _retool_exc:\n"
    "            _retool_context.__set__(_retool_hook, None)\n"
    "        _retool_sys.stderr.write('Error in sys.excepthook:\\n')\n"
    "        _retool_sys.__excepthook__(\n"
    "            type(_retool_hook), _retool_hook, _retool_tb.__get__(_retool_hook))\n"
    "        _retool_sys.stderr.write('\\nOriginal exception was:\\n')\n"
    "        _retool_sys.__excepthook__(\n"
    "            _retool_type, _retool_exc, _retool_tb.__get__(_retool_exc))\n"
    "    if type(_retool_exc) is KeyboardInterrupt:\n"  # python3 then ends by SIGINT (-2)
    "        _retool_sys.excepthook = lambda *printed: None\n"
    "        raise _retool_exc\n"
    "    raise SystemExit(1) from None\n"
)

_COMPILE = "return compile(text, '<sandbox>', 'exec')"


def _stack_limit(stack_mb: int | None) -> str:
    """The child's line that sets its soft stack limit (``RunRequest.stack_mb``), as the
    Docker agent's ``zygote._raise_soft`` does: never above the hard limit."""
    if stack_mb is None:
        return "pass"
    return (
        f"soft, hard = {stack_mb * 1024 * 1024}, resource.getrlimit(resource.RLIMIT_STACK)[1]; "
        "resource.setrlimit(resource.RLIMIT_STACK, "
        "(soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))"
    )


@functools.cache
def _compile_auto_printed() -> str:
    """How the child compiles the code for ``auto_print``: with the Docker agent's own
    module, run from its source in the child, so the host never parses the code and both
    backends print a final expression alike (read only when a call asks for it)."""
    return (
        "import sys; there = set(sys.modules); printing = {}; "
        f"exec({inspect.getsource(auto_print)!r}, printing); "
        "code = printing['compile_auto_printed'](text, '<sandbox>'); "
        # what that imported (``ast`` and its own imports) is the agent's, not the code's
        "[sys.modules.pop(name) for name in list(sys.modules) if name not in there]; "
        "return code"
    )


# Runs in the child in notebook mode. The host sends each cell as an 8-byte
# header (index, size) carrying two descriptors (the cell's stdout and stderr
# pipes), then the cell's UTF-8 source; the driver puts the pipes on fds 1
# and 2, runs the cell, puts the driver's own streams back, and answers with a
# length-prefixed JSON object {"display": [...], "error": [...]}. An EOF on the
# socket means there are no more cells. SIGINT interrupts a cell only while it
# runs (the host sends it when the cell's time is up).
_NOTEBOOK = (
    "def _retool_notebook(fd, cap):\n"
    "    import sys\n"  # the driver's modules, never a call's upload of their names:
    "    path, sys.path[:] = sys.path[:], [entry for entry in sys.path if entry != '']\n"
    "    import ast, json, os, resource, signal, socket, traceback\n"
    "    sys.path[:] = path\n"
    "    resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))\n"
    "    {stack}\n"
    "    main = globals()\n"
    "    channel = socket.socket(fileno=fd)\n"
    "    armed = [False]\n"
    "    def interrupt(signum, frame):\n"
    "        if armed[0]:\n"
    "            armed[0] = False\n"
    "            raise KeyboardInterrupt\n"
    "    signal.signal(signal.SIGINT, interrupt)\n"
    "    def receive(size):\n"
    "        chunks = []\n"
    "        while size > 0:\n"
    "            chunk = channel.recv(min(size, 1 << 20))\n"
    "            if not chunk:\n"
    "                return None\n"
    "            chunks.append(chunk)\n"
    "            size -= len(chunk)\n"
    "        return b''.join(chunks)\n"
    "    def flush():\n"
    "        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):\n"
    "            try:\n"
    "                stream.flush()\n"
    "            except BaseException:\n"
    "                pass\n"
    "    def cut(text):\n"
    "        text = str.__str__(text)  # exact: a subclass's len and slices are the code's\n"
    "        if len(text) <= cap:\n"
    "            return text\n"
    "        kept = text[-cap:] if cap > 0 else ''\n"
    "        return f'[... truncated {{len(text) - cap}} chars ...]\\n{{kept}}'\n"
    "    def tail(lines):\n"
    "        lines = [cut(line) for line in lines[-200:]]\n"
    "        kept, total = lines[-1:], 0\n"
    "        for line in reversed(lines[:-1]):\n"
    "            if total + len(line) > cap:\n"
    "                break\n"
    "            kept.append(line)\n"
    "            total += len(line)\n"
    "        left = len(lines) - len(kept)\n"
    "        header = left > 0 and lines[0].startswith('Traceback')\n"
    "        if left > header:\n"
    "            kept.append(f'  [... {{left - header}} more lines of the traceback ...]\\n')\n"
    "        if header:\n"
    "            kept.append(lines[0])\n"
    "        return kept[::-1]\n"
    "    def run_cell(index, source):\n"
    "        filename = f'<cell {{index + 1}}>'\n"
    "        display, error = [], []\n"
    "        try:\n"
    "            try:\n"
    "                signal.signal(signal.SIGINT, interrupt)\n"
    "                armed[0] = True\n"
    "                tree = ast.parse(source, filename)\n"
    "                last = None\n"
    "                if tree.body and isinstance(tree.body[-1], ast.Expr):\n"
    "                    last = tree.body.pop()\n"
    "                exec(compile(tree, filename, 'exec'), main)\n"
    "                if last is not None:\n"
    "                    expression = ast.Expression(last.value)\n"
    "                    value = eval(compile(expression, filename, 'eval'), main)\n"
    "                    if value is not None:\n"
    "                        display.append({{'text/plain': cut(repr(value))}})\n"
    "            finally:\n"
    "                armed[0] = False\n"
    "        except BaseException as exc:\n"
    "            armed[0] = False\n"
    "            try:\n"
    "                tb = own_frames_out(BaseException.__traceback__.__get__(exc))\n"
    "                if isinstance(exc, SyntaxError):\n"
    "                    tb = None\n"
    "                lines = traceback.format_exception(type(exc), exc, tb)\n"
    "            except BaseException:\n"
    "                lines = [name_of(exc) + '\\n']\n"
    "            try:\n"
    "                evalue = str(exc)\n"
    "            except BaseException:\n"
    "                evalue = '<unprintable>'\n"
    "            ename = name_of(exc)[:200]\n"
    "            error.append({{'ename': ename, 'evalue': cut(evalue),\n"
    "                          'traceback': tail(lines)}})\n"
    "        return {{'display': display, 'error': error}}\n"
    "    def name_of(exc):\n"
    "        return str.__str__(type.__dict__['__name__'].__get__(type(exc)))\n"
    "    def own_frames_out(tb):\n"
    "        kept = []\n"
    "        while tb is not None:\n"
    "            if tb.tb_frame.f_code not in (run_cell.__code__, interrupt.__code__):\n"
    "                kept.append(tb)\n"
    "            tb = tb.tb_next\n"
    "        for here, after in zip(kept, kept[1:] + [None]):\n"
    "            here.tb_next = after\n"
    "        return kept[0] if kept else None\n"
    "    saved = os.dup(1), os.dup(2)\n"
    "    while True:\n"
    "        header, fds, _flags, _address = socket.recv_fds(channel, 8, 2)\n"
    "        if len(header) < 8:\n"
    "            rest = receive(8 - len(header)) if header else None\n"
    "            if rest is None:\n"
    "                return\n"
    "            header += rest\n"
    "        source = receive(int.from_bytes(header[4:], 'big'))\n"
    "        if source is None or len(fds) != 2:\n"
    "            return\n"
    "        flush()\n"
    "        os.dup2(fds[0], 1)\n"
    "        os.dup2(fds[1], 2)\n"
    "        os.close(fds[0])\n"
    "        os.close(fds[1])\n"
    "        result = run_cell(int.from_bytes(header[:4], 'big'),\n"
    "                          source.decode('utf-8', 'surrogatepass'))\n"
    "        flush()\n"
    "        try:\n"
    "            os.dup2(saved[0], 1)\n"
    "            os.dup2(saved[1], 2)\n"
    "        except OSError:\n"
    "            pass\n"
    "        answer = json.dumps(result).encode('ascii')\n"
    "        channel.sendall(len(answer).to_bytes(4, 'big') + answer)\n"
    "globals().pop('_retool_notebook')({fd}, {cap})\n"
)

# Runs in a session's process (see "sessions" in the module docstring). Plain
# source, not a template: its settings arrive in argv (the channel's descriptor
# and the output cap). Commands arrive as an 8-byte header (command, size)
# carrying two descriptors, then ``size`` bytes: _CMD_CELL brings the cell's
# stdout/stderr pipes and its source; _CMD_FORK brings the copy's channel and
# the write end of its exit-status pipe, and the copy's working directory.
# Every command is answered with one length-prefixed JSON object. Outside a
# cell, descriptors 1 and 2 are /dev/null, so a stray writer (a thread, a
# child) never writes into another cell's pipes.
_SESSION_DRIVER = r"""
def _retool_session():
    import ast, json, os, signal, socket, sys, traceback
    own_pid = os.getpid  # bound before any cell: a cell's os.getpid = ... cannot name a fork
    link = [socket.socket(fileno=int(sys.argv[1]))]
    cap = int(sys.argv[2])
    sys.argv = ['-c']
    main = globals()
    home = [os.getcwd()]
    count = [0]
    armed = [False]

    def interrupt(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    def receive(size):
        chunks = []
        while size > 0:
            chunk = link[0].recv(min(size, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            size -= len(chunk)
        return b''.join(chunks)

    def answer(message):
        data = json.dumps(message).encode('ascii')
        link[0].sendall(len(data).to_bytes(4, 'big') + data)

    def to_null():
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)

    def flush():
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except BaseException:
                pass

    def cut(text):
        text = str.__str__(text)  # exact: a subclass's len and slices are the code's
        if len(text) <= cap:
            return text
        kept = text[-cap:] if cap > 0 else ''
        return f'[... truncated {len(text) - cap} chars ...]\n{kept}'

    def tail(lines):
        # The exception's own line, then the newest lines that fit in the cap, and the
        # header with a count of those left out: never more than about two caps.
        lines = [cut(line) for line in lines[-200:]]
        kept, total = lines[-1:], 0
        for line in reversed(lines[:-1]):
            if total + len(line) > cap:
                break
            kept.append(line)
            total += len(line)
        left = len(lines) - len(kept)
        header = left > 0 and lines[0].startswith('Traceback')
        if left > header:
            kept.append(f'  [... {left - header} more lines of the traceback ...]\n')
        if header:
            kept.append(lines[0])
        return kept[::-1]

    def name_of(exc):
        return str.__str__(type.__dict__['__name__'].__get__(type(exc)))

    def own_frames_out(tb):
        kept = []
        while tb is not None:
            if tb.tb_frame.f_code not in (run_cell.__code__, interrupt.__code__):
                kept.append(tb)
            tb = tb.tb_next
        for here, after in zip(kept, kept[1:] + [None]):
            here.tb_next = after
        return kept[0] if kept else None

    def run_cell(source):
        count[0] += 1
        filename = f'<cell {count[0]}>'
        display, error = [], []
        try:
            try:
                signal.signal(signal.SIGINT, interrupt)
                armed[0] = True
                tree = ast.parse(source, filename)
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = tree.body.pop()
                exec(compile(tree, filename, 'exec'), main)
                if last is not None:
                    value = eval(compile(ast.Expression(last.value), filename, 'eval'), main)
                    if value is not None:
                        display.append({'text/plain': cut(repr(value))})
            finally:
                armed[0] = False
        except BaseException as exc:
            armed[0] = False
            try:
                # The exception's own slots, as python3 reads them: a property of its
                # class (its __traceback__, a metaclass's __name__) is the code's.
                tb = BaseException.__traceback__.__get__(exc)
                tb = None if isinstance(exc, SyntaxError) else own_frames_out(tb)
                lines = traceback.format_exception(type(exc), exc, tb)
            except BaseException:
                tb, lines = None, [name_of(exc) + '\n']
            try:
                evalue = str(exc)
            except BaseException:
                evalue = '<unprintable>'
            ename = name_of(exc)[:200]
            error.append({'ename': ename, 'evalue': cut(evalue),
                          'traceback': tail(lines)})
            try:
                BaseException.__traceback__.__set__(exc, tb)
                sys.excepthook(type(exc), exc, tb)
            except BaseException:
                pass
        return {'display': display, 'error': error}

    def wait_for(copy, status):
        # The copy's parent: report how it ended on the status pipe. Exec'd into a
        # small interpreter so this process does not pin the snapshot's memory.
        try:
            if status != 3:
                os.dup2(status, 3)
            os.set_inheritable(3, True)
            null = os.open(os.devnull, os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(null, target)
            os.closerange(4, 1 << 16)
            waiter = ('import os, sys\n'
                      'try:\n'
                      '    status = os.waitpid(int(sys.argv[1]), 0)[1]\n'
                      'except ChildProcessError:\n'
                      '    raise SystemExit\n'
                      'os.write(3, status.to_bytes(4, "big"))\n')
            os.execv(sys.executable, [sys.executable, '-I', '-S', '-B', '-c', waiter, str(copy)])
        except BaseException:
            pass
        try:
            os.write(3, os.waitpid(copy, 0)[1].to_bytes(4, 'big'))
        finally:
            os._exit(0)

    def reseed():
        # A fork's copy draws its own numbers from the libraries' generators (those in
        # a module's namespace: numpy's global, sympy's), as CPython reseeds random's;
        # one the session's code holds in __main__ keeps its state. The agent's
        # generators.OfASession does the same in a Docker fork.
        import _random
        import random
        kinds = [_random.Random]
        numpy = sys.modules.get('numpy')
        for name in ('RandomState', 'Generator', 'BitGenerator'):
            kind = getattr(getattr(numpy, 'random', None), name, None)
            if isinstance(kind, type):
                kinds.append(kind)
        kinds = tuple(kinds)
        found = {}
        for name, module in list(sys.modules.items()):
            space = getattr(module, '__dict__', None)
            if type(name) is not str or name == '__main__' or type(space) is not dict:
                continue
            for value in list(space.values()):
                kind = type(value)
                if issubclass(kind, kinds) and not issubclass(kind, random.SystemRandom):
                    found[id(value)] = value
        def inner(each):  # a numpy generator's bit generator (None: it is one, or random's)
            if isinstance(each, _random.Random):
                return None
            return getattr(each, 'bit_generator', None) or getattr(each, '_bit_generator', None)

        owned = {id(inner(each)) for each in found.values()}
        for key, each in found.items():
            if key in owned:
                continue
            seed = int.from_bytes(os.urandom(32), 'little')
            try:
                if isinstance(each, random.Random):
                    random.Random.seed(each, seed)
                elif isinstance(each, _random.Random):
                    _random.Random.seed(each, seed)
                else:
                    bits = inner(each)
                    each.__init__(type(bits)(seed) if bits is not None else seed)
            except Exception:
                pass

    def fork(fds, new_home):
        # A double fork: the first child exits at once (this process reaps it), so the
        # copy's parent is not this session; that parent (M) only waits for the copy.
        new_link, status = fds
        try:
            first = os.fork()
        except OSError as exc:
            os.close(new_link)
            os.close(status)
            answer({'ok': False, 'reason': f'fork: {exc}'})
            return
        if first == 0:
            try:
                if os.fork() != 0:
                    os._exit(0)
                os.setsid()
                previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                copy = os.fork()
                if copy != 0:
                    os.close(new_link)
                    wait_for(copy, status)
                os.setsid()
                if previous is not None:
                    signal.signal(signal.SIGCHLD, previous)
                os.close(status)
                link[0].close()
                link[0] = socket.socket(fileno=new_link)
                old = home[0]
                try:
                    here = os.getcwd()
                except OSError:
                    here = old
                target = new_home
                if here == old or here.startswith(old + os.sep):
                    target = new_home + here[len(old):]
                try:
                    os.chdir(target)
                except OSError:
                    os.chdir(new_home)
                home[0] = new_home
                try:
                    reseed()
                except Exception:
                    pass
                answer({'pid': own_pid()})
            except BaseException:
                os._exit(1)
            return
        os.close(new_link)
        os.close(status)
        try:
            ended = os.waitpid(first, 0)[1]
        except ChildProcessError:  # SIGCHLD ignored by the code: reaped already
            ended = 0
        if ended == 0:
            answer({'ok': True})
        else:
            answer({'ok': False, 'reason': 'fork: the intermediate process failed'})

    signal.signal(signal.SIGINT, interrupt)
    to_null()
    answer({'pid': own_pid()})
    while True:
        try:
            header, fds, _flags, _address = socket.recv_fds(link[0], 8, 2)
            if len(header) < 8:
                rest = receive(8 - len(header)) if header else None
                header = None if rest is None else header + rest
            payload = None if header is None else receive(int.from_bytes(header[4:], 'big'))
        except OSError:
            return
        if header is None or payload is None or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return
        command = int.from_bytes(header[:4], 'big')
        if command == 1:
            flush()
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            os.close(fds[0])
            os.close(fds[1])
            result = run_cell(payload.decode('utf-8', 'surrogatepass'))
            flush()
            to_null()
            answer(result)
        elif command == 2:
            fork(fds, os.fsdecode(payload))
        else:
            for fd in fds:
                os.close(fd)
            return
globals().pop('_retool_session')()
"""

_PIPE_GRACE = 0.25
"""Seconds to collect output still in the pipes after the process group is gone."""
_INTERRUPT_GRACE = 1.0
"""Seconds a cell past its ``cell_timeout`` has to stop after SIGINT before the group is killed."""
_LAST_WORDS = 0.1
"""Seconds to wait for a cell's answer already on its way when the process is seen to end."""
_END_SEEN = 0.5
"""Seconds between a driver's channel closing and the process being seen to end, at most."""
_CONTROL_BYTES = 1 << 16
"""Largest answer to a session's start or fork (a pid, a short reason)."""


def _answer_bytes(limit: int) -> int:
    """Largest answer a driver can send for one cell under ``limit`` characters: one
    display, the evalue and the traceback (at most twice ``limit`` in all) cut to it,
    200 lines' overhead, at 12 bytes a character (one outside the BMP is two escapes).
    A larger answer is a broken protocol: the driver is code a cell can reach, and a
    64 MiB answer of empty records once cost the host 17 GB to parse."""
    return 12 * (4 * limit + 200 * 64 + 1024)


_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""Directories walked to an upload or a fetched file: passed through, not read, as the
Docker agent does (``supervisor._DIR_FLAGS``) and python3 opening the path does."""


class LocalSubprocessBackend(Backend):
    """A fresh local Python subprocess per call. NOT a security boundary."""

    name = "local"

    def __init__(self, config: LocalConfig | None = None) -> None:
        self.config = config or LocalConfig()
        self._sessions: set[_LocalSession] = set()
        self._removals = _Removals()

    def _child_env(self) -> dict[str, str]:
        base = dict(os.environ) if self.config.inherit_env else {"PATH": os.defpath}
        return {**base, **CHILD_ENV_OVERRIDES}

    async def run(self, request: RunRequest) -> ExecResult:
        started = time.perf_counter()
        try:
            files = dict(request.files)
            if request.script is not None:  # the code is also a file there
                files[request.script] = request.code.encode("utf-8", "surrogatepass")
            workdir = _Workdir.create(files) if files or request.fetch else None
        except OSError as exc:
            return _failure(f"could not write the call's files: {exc}", started)
        try:
            return await self._run_in(request, started, workdir)
        finally:
            if workdir is not None:
                self._removals.remove_soon(workdir)

    async def _run_in(
        self, request: RunRequest, started: float, workdir: _Workdir | None
    ) -> ExecResult:
        with contextlib.ExitStack() as cleanup:
            try:
                stdin = _stdin_file(request.stdin)
            except OSError as exc:
                return _failure(f"could not store the call's stdin: {exc}", started)
            if stdin is not None:
                cleanup.enter_context(stdin)
            if request.cells:
                result = await self._run_cells(request, started, workdir, stdin)
            else:
                result = await self._run_code(request, started, workdir, stdin)
            if workdir is not None and request.fetch:
                files, errors = workdir.fetch(request.fetch, request.fetch_budget)
                result = result.model_copy(update={"files": files, "fetch_errors": errors})
            return result

    async def _run_code(
        self,
        request: RunRequest,
        started: float,
        workdir: _Workdir | None,
        stdin: IO[bytes] | None,
    ) -> ExecResult:
        loop = asyncio.get_running_loop()
        capture = _Capture(loop, read_cap_bytes(self.config.max_output_chars))
        script = "pass"
        if request.script is not None and workdir is not None:  # as `python SCRIPT` would
            path = os.path.join(workdir.path, request.script)
            script = (  # (the script's directory first on the path, as python3 puts it)
                f"sys.argv[:] = [{path!r}]; globals()['__file__'] = {path!r}; "
                f"sys.path[0] = {os.path.dirname(path)!r}"
            )
        bootstrap = _BOOTSTRAP.format(
            compile=_compile_auto_printed() if request.auto_print else _COMPILE,
            cpu=request.cpu_seconds,
            stack=_stack_limit(request.stack_mb),
            stdin_fd=-1 if stdin is None else stdin.fileno(),
            script=script,
        )
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: capture,
                self.config.python,
                "-B",
                "-c",
                bootstrap,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._child_env(),
                start_new_session=True,
                cwd=None if workdir is None else workdir.path,
                pass_fds=() if stdin is None else (stdin.fileno(),),
            )
        except OSError as exc:
            return _failure(f"could not start {self.config.python!r}: {exc}", started)

        timed_out = False
        try:
            pipe = transport.get_pipe_transport(0)
            if pipe is not None:
                pipe.write(request.code.encode("utf-8", errors="surrogatepass"))  # type: ignore[attr-defined]
                pipe.close()
            try:
                await asyncio.wait_for(asyncio.shield(capture.exited), request.timeout)
            except TimeoutError:
                timed_out = True
        finally:
            await _end(transport, capture)

        returncode = None if timed_out else transport.get_returncode()
        return self._result(capture, returncode, timed_out, started)

    async def _run_cells(
        self,
        request: RunRequest,
        started: float,
        workdir: _Workdir | None,
        stdin: IO[bytes] | None,
    ) -> ExecResult:
        loop = asyncio.get_running_loop()
        limit = self.config.max_output_chars
        capture = _Capture(loop, read_cap_bytes(limit))
        try:
            host, child = socket.socketpair()
        except OSError as exc:
            return _failure(f"could not make the notebook's channel: {exc}", started)
        with host:
            with child:
                driver = _NOTEBOOK.format(
                    cpu=request.cpu_seconds,
                    stack=_stack_limit(request.stack_mb),
                    fd=child.fileno(),
                    cap=_cell_chars(limit, request.cell_output_chars),
                )
                try:
                    transport, _ = await loop.subprocess_exec(
                        lambda: capture,
                        self.config.python,
                        "-B",
                        "-c",
                        driver,
                        stdin=asyncio.subprocess.DEVNULL if stdin is None else stdin.fileno(),
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        env=self._child_env(),
                        start_new_session=True,
                        cwd=None if workdir is None else workdir.path,
                        pass_fds=(child.fileno(),),
                    )
                except OSError as exc:
                    return _failure(f"could not start {self.config.python!r}: {exc}", started)
            host.setblocking(False)
            notebook = _Notebook(
                loop,
                transport.get_pid(),
                capture.exited,
                host,
                limit,
                stream_chars=request.cell_output_chars,
            )
            deadline = loop.time() + request.timeout
            try:
                await notebook.run(request.cells, _cell_limit(request.cell_timeout), deadline)
                host.close()  # no more cells: the driver returns and the interpreter exits
                if not notebook.killed:
                    remaining = max(0.0, deadline - loop.time())
                    try:
                        await asyncio.wait_for(asyncio.shield(capture.exited), remaining)
                    except TimeoutError:
                        notebook.timed_out = True
            finally:
                await _end(transport, capture)

        timed_out = notebook.timed_out
        returncode = None if timed_out else transport.get_returncode()
        result = self._result(capture, returncode, timed_out, started)
        return result.model_copy(update={"cells": notebook.cells})

    async def open_session(self, *, memory_mb: int | None = None) -> SessionHandle:
        """A new session: an interpreter and a working directory of its own (see above).

        ``memory_mb`` is accepted and ignored: the local backend limits no memory.
        """
        del memory_mb
        loop = asyncio.get_running_loop()
        workdir = _session_workdir()
        capture = _Capture(loop, _START_OUTPUT_BYTES)
        try:
            host, child = socket.socketpair()
        except OSError as exc:
            _remove_tree(workdir)
            raise SessionLostError(f"the session could not start: {exc}") from exc
        try:
            with child:
                transport, _ = await loop.subprocess_exec(
                    lambda: capture,
                    self.config.python,
                    "-B",
                    "-c",
                    _SESSION_DRIVER,
                    str(child.fileno()),
                    str(self.config.max_output_chars),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env=self._child_env(),
                    start_new_session=True,
                    cwd=workdir,
                    pass_fds=(child.fileno(),),
                )
        except BaseException as exc:
            host.close()
            _remove_tree(workdir)
            if isinstance(exc, OSError):
                raise SessionLostError(
                    f"the session could not start {self.config.python!r}: {exc}"
                ) from exc
            raise
        host.setblocking(False)
        session = _LocalSession(self, _SpawnedProcess(transport, capture), host, workdir)
        try:
            hello = await _await_message(loop, host, capture.exited)
            if hello is None or hello.get("pid") != session.pid:
                await asyncio.wait([capture.exited], timeout=_LAST_WORDS)
                raise SessionLostError(f"the session could not start{_start_failure(capture)}")
        except BaseException:
            await session.close()
            raise
        return session

    async def close(self) -> None:
        """End every session still open (their processes and working directories), and
        wait for the calls' directories still being removed."""
        for session in list(self._sessions):
            await session.close()
        try:
            done = await asyncio.to_thread(self._removals.wait, CLOSE_REMOVALS_WAIT)
        except RuntimeError:  # at interpreter exit: the executors are shut down already
            done = self._removals.wait(CLOSE_REMOVALS_WAIT)
        if not done:  # (its thread goes on; the interpreter's exit waits for it)
            log.warning("the calls' directories were still being removed when closed")

    def _result(
        self, capture: _Capture, returncode: int | None, timed_out: bool, started: float
    ) -> ExecResult:
        limit = self.config.max_output_chars
        out_text, out_dropped = capture.stdout.finish(limit)
        err_text, err_dropped = capture.stderr.finish(limit)
        return ExecResult(
            ok=not timed_out and returncode == 0,
            stdout=out_text,
            stderr=err_text,
            returncode=returncode,
            timed_out=timed_out,
            latency=time.perf_counter() - started,
            outcome=classify_exit(returncode, timed_out=timed_out),
            stdout_dropped_chars=out_dropped,
            stderr_dropped_chars=err_dropped,
            backend=self.name,
        )


class _Capture(asyncio.SubprocessProtocol):
    """Feeds both pipes into tail buffers as data arrives; notes exit and pipe closure.

    ``process_exited`` fires when the process ends, independently of whether
    something else still holds its pipes (``Process.wait()`` would wait for both).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, cap_bytes: int) -> None:
        self.stdout = TailBuffer(cap_bytes)
        self.stderr = TailBuffer(cap_bytes)
        self.exited: asyncio.Future[None] = loop.create_future()
        self.pipes_closed: asyncio.Future[None] = loop.create_future()
        self._open_pipes = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        chunk = data.encode() if isinstance(data, str) else data
        (self.stdout if fd == 1 else self.stderr).feed(chunk)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open_pipes.discard(fd)
        if not self._open_pipes and not self.pipes_closed.done():
            self.pipes_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


async def _end(transport: asyncio.SubprocessTransport, capture: _Capture) -> None:
    """Kill the process group, wait for the process, collect the pipes' last output."""
    _kill_group(transport.get_pid())
    try:
        await asyncio.shield(capture.exited)
        # Output still in the pipes arrives at once; a stray process that
        # escaped the group and holds the pipes open gets a short grace only.
        await asyncio.wait([capture.pipes_closed], timeout=_PIPE_GRACE)
    finally:
        transport.close()


# -- notebook mode -------------------------------------------------------------------


class _Notebook:
    """The host's side of a cell driver: hands over cells, times them, reads their output.

    One notebook call uses it for all its cells; a session, for one cell at a
    time. ``pid`` leads the process group killed when a cell must end, and
    ``exited`` is done once that process is gone.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pid: int,
        exited: asyncio.Future[None],
        channel: socket.socket,
        limit: int,
        *,
        stream_chars: int | None = None,
    ) -> None:
        self._loop = loop
        self._pid = pid
        self._exited = exited
        self._channel = channel
        self._limit = limit
        self._stream_chars = _cell_chars(limit, stream_chars)
        """Each cell's stdout and stderr kept (``RunRequest.cell_output_chars``), and the
        characters of its value and error texts (as the driver cut them)."""
        self.cells: list[CellResult] = []
        self.timed_out = False
        """The notebook's time passed, or a cell's did and the process had to be killed."""
        self.killed = False

    async def run(self, cells: tuple[str, ...], cell_limit: float, deadline: float) -> None:
        for index, source in enumerate(cells):
            if self._exited.done() or self._loop.time() >= deadline:
                if not self._exited.done():
                    self.timed_out = True
                    self._kill()
                return
            cell = await self.run_cell(index, source, cell_limit, deadline)
            if cell is None:
                return
            self.cells.append(cell)
            if not cell.finished:
                return

    async def run_cell(
        self, tag: int, source: str, cell_limit: float, deadline: float
    ) -> CellResult | None:
        """One cell's result, or None when it could not be handed over (the process is gone).

        ``tag`` is the header's first word: the cell's index in a notebook, the
        command (``_CMD_CELL``) for a session, whose driver numbers its cells itself.
        """
        out = _PipeTail(self._loop, self._stream_chars)
        try:
            err = _PipeTail(self._loop, self._stream_chars)
        except BaseException:
            out.finish()
            raise
        try:
            payload = source.encode("utf-8", "surrogatepass")
            header = tag.to_bytes(4, "big") + len(payload).to_bytes(4, "big")
            try:
                socket.send_fds(self._channel, [header], [out.write_fd, err.write_fd])
            except OSError:
                return None
            finally:
                out.close_write()
                err.close_write()
            answer, timed_out = await self._exchange(payload, cell_limit, deadline)
        finally:
            stdout, stdout_dropped = out.finish()
            stderr, stderr_dropped = err.finish()
        display, error = (
            _answer_fields(answer, self._stream_chars) if answer is not None else ([], [])
        )
        return CellResult(
            stdout=stdout,
            stderr=stderr,
            stdout_dropped_chars=stdout_dropped,
            stderr_dropped_chars=stderr_dropped,
            display=display,
            error=error,
            finished=answer is not None,
            timed_out=timed_out,
        )

    async def _exchange(
        self, payload: bytes, cell_limit: float, deadline: float
    ) -> tuple[dict[str, Any] | None, bool]:
        """Send the cell's source and wait for its answer: (the answer or None, timed out)."""
        exchange = asyncio.ensure_future(self._send_and_read(payload))
        exited = self._exited
        cell_deadline = self._loop.time() + cell_limit
        interrupted_at: float | None = None
        try:
            while True:
                now = self._loop.time()
                if now >= deadline:
                    self.timed_out = True
                    self._kill()
                    return None, interrupted_at is not None
                if interrupted_at is None and now >= cell_deadline:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(self._pid, signal.SIGINT)
                    interrupted_at = now
                if interrupted_at is not None and now >= interrupted_at + _INTERRUPT_GRACE:
                    self.timed_out = True
                    self._kill()
                    return None, True
                wake = min(
                    deadline,
                    cell_deadline if interrupted_at is None else interrupted_at + _INTERRUPT_GRACE,
                )
                waiting: set[asyncio.Future[Any]] = {exchange, exited}
                await asyncio.wait(waiting, timeout=wake - now, return_when=asyncio.FIRST_COMPLETED)
                if exited.done() and not exchange.done():
                    # An answer sent just before the end may still be in the socket.
                    await asyncio.wait({exchange}, timeout=_LAST_WORDS)
                if exchange.done():
                    answer = None if exchange.cancelled() else _result_or_none(exchange)
                    if answer is None and not exited.done():
                        # The channel ended first: a process that is ending is seen
                        # to end in a moment; one that is not broke the protocol.
                        await asyncio.wait({exited}, timeout=_END_SEEN)
                        if not exited.done():
                            self._kill()
                    return answer, interrupted_at is not None
                if exited.done():
                    return None, interrupted_at is not None
        finally:
            if not exchange.done():
                exchange.cancel()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await exchange

    async def _send_and_read(self, payload: bytes) -> dict[str, Any] | None:
        return await _send_and_read(self._loop, self._channel, payload, _answer_bytes(self._limit))

    def _kill(self) -> None:
        self.killed = True
        _kill_group(self._pid)


class _PipeTail:
    """One cell's stream: a pipe whose write end goes to the child, read here into a tail."""

    _DRAIN_READS = 1024
    """Most reads when a cell ends (data written before its answer is at most a pipe's worth)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self._buffer = TailBuffer(read_cap_bytes(limit))
        self._read_fd, self.write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._reading = True
        loop.add_reader(self._read_fd, self._read_some)

    def _read_some(self) -> bool:
        """Read what is there; False once nothing more will come now (EOF or empty)."""
        try:
            data = os.read(self._read_fd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._stop_reading()
            return False
        self._buffer.feed(data)
        return True

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._read_fd)

    def close_write(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def finish(self) -> tuple[str, int]:
        """Everything the cell wrote (what is already in the pipe), as text and chars dropped."""
        self.close_write()
        if self._reading:
            for _ in range(self._DRAIN_READS):
                if not self._read_some():
                    break
            self._stop_reading()
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1
        return self._buffer.finish(self._limit)


async def _send_and_read(
    loop: asyncio.AbstractEventLoop,
    channel: socket.socket,
    payload: bytes,
    max_bytes: int = _CONTROL_BYTES,
) -> dict[str, Any] | None:
    """Send ``payload`` (may be empty), then read one length-prefixed JSON object (None: none,
    or one larger than ``max_bytes``)."""
    try:
        if payload:
            await loop.sock_sendall(channel, payload)
        size = await _receive(loop, channel, 4)
        if size is None or int.from_bytes(size, "big") > max_bytes:
            return None
        data = await _receive(loop, channel, int.from_bytes(size, "big"))
    except OSError:
        return None
    if data is None:
        return None
    try:
        answer = json.loads(data)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


async def _receive(
    loop: asyncio.AbstractEventLoop, channel: socket.socket, size: int
) -> bytes | None:
    chunks: list[bytes] = []
    while size > 0:
        chunk = await loop.sock_recv(channel, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _cell_chars(limit: int, cell_output_chars: int | None) -> int:
    """The characters of each cell's texts kept: ``cell_output_chars`` within ``limit``."""
    return limit if cell_output_chars is None else min(cell_output_chars, limit)


def _cell_limit(cell_timeout: float | None) -> float:
    if cell_timeout is None or not math.isfinite(cell_timeout) or cell_timeout <= 0:
        return math.inf
    return cell_timeout


def _result_or_none(task: asyncio.Future[dict[str, Any] | None]) -> dict[str, Any] | None:
    if task.exception() is not None:
        return None
    return task.result()


def _answer_fields(
    answer: Mapping[str, Any], limit: int
) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """The driver's display and error lists, checked and bounded (nothing else is taken:
    the answer is made by code a cell can reach, so a field of another shape is empty)."""
    display: list[dict[str, str]] = []
    for item in _listed(answer.get("display"))[:1]:  # a cell displays one value
        if isinstance(item, dict) and isinstance(item.get("text/plain"), str):
            display.append({"text/plain": _bounded(item["text/plain"], limit)})
    error: list[dict[str, Any]] = []
    for item in _listed(answer.get("error"))[:1]:  # and raises at most one exception
        if not isinstance(item, dict):
            continue
        trace = item.get("traceback")
        error.append(
            {
                "ename": _bounded(str(item.get("ename", "")), 200),
                "evalue": _bounded(str(item.get("evalue", "")), limit),
                "traceback": [
                    _bounded(line, limit) for line in _listed(trace)[-200:] if isinstance(line, str)
                ],
            }
        )
    return display, error


def _listed(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _bounded(text: str, limit: int) -> str:
    """``text`` as valid UTF-8 text, cut to ``limit`` characters by the seed's rule if longer
    (a string the driver already cut, marker included, passes unchanged)."""
    return within(text.encode("utf-8", "replace").decode("utf-8"), limit)


# -- sessions --------------------------------------------------------------------------

_CMD_CELL = 1
_CMD_FORK = 2
_SESSION_START = 10.0
"""Seconds a new session or a fork has to report that it is ready."""
_SESSION_END = 5.0
"""Seconds to wait for a session's process to be gone after SIGKILL."""
_START_OUTPUT_BYTES = 1 << 16
"""Bytes of a session process's own output kept until it is ready (shown if it fails to start)."""


class _SessionProcess:
    """A session's interpreter as the host sees it: its pid, and when and how it ended."""

    pid: int
    exited: asyncio.Future[None]

    def returncode(self) -> int | None:
        """Its exit status (negative: killed by that signal); None while alive or unknown."""
        raise NotImplementedError

    def release(self) -> None:
        """Let go of what watches the process (after it ended or was killed)."""


class _SpawnedProcess(_SessionProcess):
    """A session's first process: a child of the host, started with the driver."""

    def __init__(self, transport: asyncio.SubprocessTransport, capture: _Capture) -> None:
        self._transport = transport
        self.capture = capture
        self.pid = transport.get_pid()
        self.exited = capture.exited

    def returncode(self) -> int | None:
        return self._transport.get_returncode() if self.exited.done() else None

    def release(self) -> None:
        self._transport.close()


class _ForkedProcess(_SessionProcess):
    """A fork's copy: not the host's child. Its parent (a small waiter) writes the copy's
    wait status on a pipe when it ends; the pipe's end of file means the copy is gone."""

    def __init__(self, loop: asyncio.AbstractEventLoop, status_fd: int) -> None:
        self._loop = loop
        self._fd = status_fd
        self._status = bytearray()
        self.pid = 0  # known once the copy says hello
        self.exited = loop.create_future()
        os.set_blocking(status_fd, False)
        loop.add_reader(status_fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data and len(self._status) < 64:
            self._status += data
            return
        self._stop()

    def _stop(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        if not self.exited.done():
            self.exited.set_result(None)

    def returncode(self) -> int | None:
        if not self.exited.done() or len(self._status) != 4:
            return None
        return os.waitstatus_to_exitcode(int.from_bytes(self._status, "big"))

    def release(self) -> None:
        self._stop()


class _LocalSession(SessionHandle):
    """One local session: an interpreter of its own, in a working directory of its own.

    NOT a security boundary (see the module docstring). ``pid`` and ``workdir`` say
    where it lives, for tests and for the curious.
    """

    def __init__(
        self,
        backend: LocalSubprocessBackend,
        process: _SessionProcess,
        channel: socket.socket,
        workdir: str,
    ) -> None:
        self._backend = backend
        self._process = process
        self._channel = channel
        self.workdir = workdir
        self.lost: str | None = None
        self._closed = False
        self._ended = False
        backend._sessions.add(self)

    @property
    def pid(self) -> int:
        return self._process.pid

    def _check_usable(self) -> None:
        if self.lost is not None:
            raise SessionLostError(f"this session is gone: {self.lost}")
        if self._closed:
            raise SessionLostError("this session was closed")
        if self._process.exited.done():
            self.lost = self._ended_reason()
            raise SessionLostError(f"this session is gone: {self.lost}")

    def _ended_reason(self) -> str:
        returncode = self._process.returncode()
        if returncode is None:
            return "the session's interpreter ended"
        if returncode >= 0:
            return f"the session's interpreter exited (status {returncode})"
        return f"the session's interpreter was killed by {_signal_name(-returncode)}"

    def _lose(self, reason: str) -> None:
        """The interpreter cannot be trusted to be in step any more: kill it now."""
        if self.lost is None:
            self.lost = reason
        _kill_group(self.pid)

    # -- cells -------------------------------------------------------------------------

    async def run(self, code: str, timeout: float) -> ExecResult:
        self._check_usable()
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        limit = self._backend.config.max_output_chars
        driver = _Notebook(loop, self.pid, self._process.exited, self._channel, limit)
        try:
            cell = await driver.run_cell(_CMD_CELL, code, _cell_limit(timeout), math.inf)
        except BaseException:
            # The cell may still run and answer later, out of step with the next one.
            self._lose("a call was cancelled while its cell ran")
            raise
        if cell is not None and cell.finished:
            timed_out = cell.timed_out
            returncode = None if timed_out else (1 if cell.error else 0)
            outcome = classify_exit(returncode, timed_out=timed_out)
            return ExecResult(
                ok=outcome is Outcome.SUCCESS,
                stdout=cell.stdout,
                stderr=cell.stderr,
                returncode=returncode,
                timed_out=timed_out,
                latency=time.perf_counter() - started,
                outcome=outcome,
                stdout_dropped_chars=cell.stdout_dropped_chars,
                stderr_dropped_chars=cell.stderr_dropped_chars,
                backend=self._backend.name,
                cells=[cell],
            )
        # The interpreter is gone (it ended, or was killed after its interrupt grace).
        if not driver.killed:
            _kill_group(self.pid)
        await asyncio.wait([self._process.exited], timeout=_SESSION_END)
        timed_out = driver.timed_out or (cell is not None and cell.timed_out)
        if driver.timed_out:
            self.lost = (
                f"the cell did not stop within {_INTERRUPT_GRACE:g} s of its {timeout:g} s "
                "timeout, so the session was killed"
            )
        elif driver.killed:
            self.lost = "the session's interpreter broke the cell protocol and was killed"
        else:
            self.lost = self._ended_reason()
        returncode = self._process.returncode()
        if returncode is None:
            returncode = -signal.SIGKILL  # ended by a signal that could not be attributed
        if timed_out:
            returncode = None
        outcome = classify_exit(returncode, timed_out=timed_out)
        return ExecResult(
            ok=outcome is Outcome.SUCCESS,  # an os._exit(0) ended the session, but well
            stdout=cell.stdout if cell else "",
            stderr=cell.stderr if cell else "",
            returncode=returncode,
            timed_out=timed_out,
            latency=time.perf_counter() - started,
            outcome=outcome,
            stdout_dropped_chars=cell.stdout_dropped_chars if cell else 0,
            stderr_dropped_chars=cell.stderr_dropped_chars if cell else 0,
            backend=self._backend.name,
            detail=f"session lost: {self.lost}",
        )

    # -- forks -------------------------------------------------------------------------

    async def fork(self) -> _LocalSession:
        self._check_usable()
        loop = asyncio.get_running_loop()
        workdir = _session_workdir()
        copying = asyncio.ensure_future(asyncio.to_thread(_copy_tree, self.workdir, workdir))
        try:
            await asyncio.shield(copying)
        except BaseException as exc:
            # A cancelled copy goes on in its thread: remove the directory once it is done,
            # in a thread too (up to FORK_COPY_ENTRIES names: never on the loop).
            copying.add_done_callback(
                lambda _task: loop.run_in_executor(None, _remove_tree, workdir)
            )
            if isinstance(exc, trees.TooLarge):
                raise SessionError(f"the fork failed: {exc}") from exc
            if isinstance(exc, OSError):  # the parent is untouched: only this fork failed
                raise SessionError(
                    f"the fork failed: could not copy the working directory: {exc}"
                ) from exc
            raise
        try:
            return await self._fork_process(loop, workdir)
        except BaseException:
            await asyncio.to_thread(_remove_tree, workdir)
            raise

    async def _fork_process(self, loop: asyncio.AbstractEventLoop, workdir: str) -> _LocalSession:
        ours, theirs = socket.socketpair()
        channel_inode = os.fstat(theirs.fileno()).st_ino  # the copy holds this socket
        status_r, status_w = os.pipe()
        payload = os.fsencode(workdir)
        header = _CMD_FORK.to_bytes(4, "big") + len(payload).to_bytes(4, "big")
        try:
            socket.send_fds(self._channel, [header], [theirs.fileno(), status_w])
        except OSError as exc:
            ours.close()
            os.close(status_r)
            self._lose(f"the session's interpreter is gone ({exc})")
            raise SessionLostError(f"this session is gone: {self.lost}") from exc
        finally:
            theirs.close()
            os.close(status_w)
        copy = _ForkedProcess(loop, status_r)
        ours.setblocking(False)
        acknowledged = False
        try:
            ack = await _await_message(loop, self._channel, self._process.exited, payload)
            acknowledged = True
            if ack is None:
                reason = (
                    self._ended_reason()
                    if self._process.exited.done()
                    else "the session's interpreter did not answer a fork and was killed"
                )
                self._lose(reason)
                raise SessionLostError(f"this session is gone: {reason}")
            if ack.get("ok") is not True:
                raise SessionError(f"the fork failed: {str(ack.get('reason'))[:300]}")
            hello = await _await_message(loop, ours, copy.exited)
            pid = hello.get("pid") if hello is not None else None
            known = {session.pid for session in self._backend._sessions}
            if not _is_fork_copy(pid, known, channel_inode):
                raise SessionError("the fork failed: the copy did not start")
            copy.pid = pid
        except BaseException:
            if not acknowledged:
                self._lose("a fork was cancelled before the interpreter answered it")
            ours.close()  # the copy, if any, reads the end of its channel and leaves
            if copy.pid:
                _kill_group(copy.pid)
            await asyncio.wait([copy.exited], timeout=_SESSION_END)
            copy.release()
            raise
        return _LocalSession(self._backend, copy, ours, workdir)

    # -- the end -------------------------------------------------------------------------

    async def close(self) -> None:
        self._closed = True
        await self._end()

    async def _end(self) -> None:
        """Kill the interpreter's process group, wait until it is gone, remove its directory."""
        if self._ended:
            return
        self._ended = True
        self._backend._sessions.discard(self)
        try:
            try:
                _kill_group(self.pid)
            finally:
                self._channel.close()
            await asyncio.wait([self._process.exited], timeout=_SESSION_END)
        finally:
            self._process.release()
            try:
                await asyncio.to_thread(_remove_tree, self.workdir)
            except RuntimeError:  # the interpreter is exiting (no new threads): here, then
                _remove_tree(self.workdir)  # (its folder stayed in /tmp for good: red team D)


async def _await_message(
    loop: asyncio.AbstractEventLoop,
    channel: socket.socket,
    exited: asyncio.Future[None],
    payload: bytes = b"",
) -> dict[str, Any] | None:
    """One JSON answer on ``channel`` within ``_SESSION_START`` (None: none came, or the
    process ended first)."""
    exchange = asyncio.ensure_future(_send_and_read(loop, channel, payload))
    try:
        waiting: set[asyncio.Future[Any]] = {exchange, exited}
        await asyncio.wait(waiting, timeout=_SESSION_START, return_when=asyncio.FIRST_COMPLETED)
        if exited.done() and not exchange.done():
            await asyncio.wait({exchange}, timeout=_LAST_WORDS)
        return _result_or_none(exchange) if exchange.done() and not exchange.cancelled() else None
    finally:
        if not exchange.done():
            exchange.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await exchange


def _session_workdir() -> str:
    """A new, empty working directory for a session (its real path: the driver compares
    it with ``os.getcwd()``)."""
    return os.path.realpath(tempfile.mkdtemp(prefix="retool-exec-session-"))


FORK_COPY_BYTES = 1 << 30
"""Most bytes a local fork copies from its parent's working directory (as files say they
hold: a sparse file's hole costs no disk in the parent but is written out in full)."""
FORK_COPY_ENTRIES = 100_000
"""Most names (files, directories, links) a local fork copies."""


def _copy_tree(source: str, target: str) -> None:
    """Copy a session's working directory for a fork (``trees.copy_tree``: no recursion,
    links copied as links, named pipes made anew, sockets left out). More than
    ``FORK_COPY_BYTES`` or ``FORK_COPY_ENTRIES`` is refused (``trees.TooLarge``): a cell's
    2 GiB hole once took the host 7.8 s and 2 GiB of disk, with no limit."""
    trees.copy_tree(source, target, max_bytes=FORK_COPY_BYTES, max_entries=FORK_COPY_ENTRIES)


def _start_failure(capture: _Capture) -> str:
    """What a session process that did not start said, for the error message."""
    said, _dropped = capture.stderr.finish(2000)
    return f"; its interpreter said:\n{said}" if said.strip() else ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# -- stdin and files -------------------------------------------------------------------


def _stdin_file(data: bytes | None) -> IO[bytes] | None:
    """An unlinked temporary file holding exactly ``data``, positioned at its start."""
    if data is None:
        return None
    handle = tempfile.TemporaryFile()  # noqa: SIM115 - the caller closes it after the call
    try:
        handle.write(data)
        handle.flush()
        handle.seek(0)
    except BaseException:
        handle.close()
        raise
    return handle


class _Workdir:
    """A fresh directory for one call: files written in before, read back after, then removed.

    The host keeps a descriptor of the directory, so the code renaming or
    replacing it changes nothing about what is read back; every path below
    it is walked one component at a time with ``O_NOFOLLOW``.
    """

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def create(cls, files: Mapping[str, bytes]) -> _Workdir:
        path = tempfile.mkdtemp(prefix="retool-exec-")
        try:
            workdir = cls(path, os.open(path, _DIR_FLAGS))
        except BaseException:
            os.rmdir(path)
            raise
        try:
            for name, content in files.items():
                workdir._write(name, content)
        except BaseException:
            workdir.remove()
            raise
        return workdir

    def _write(self, name: str, content: bytes) -> None:
        *parents, leaf = name.split("/")
        with self._walk(parents, create=True) as parent:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(leaf, flags, 0o644, dir_fd=parent)
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)

    @contextlib.contextmanager
    def _walk(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        """A descriptor of the directory ``parts`` below the root, no link followed."""
        fd = os.dup(self._fd)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def fetch(self, paths: tuple[str, ...], budget: int) -> tuple[dict[str, bytes], dict[str, str]]:
        """The files found (within ``budget`` bytes in all) and why the others were not."""
        files: dict[str, bytes] = {}
        errors: dict[str, str] = {}
        for path in paths:
            data = self._read(path, budget)
            if isinstance(data, str):
                errors[path] = data
            else:
                files[path] = data
                budget -= len(data)
        return files, errors

    def _read(self, path: str, budget: int) -> bytes | str:
        """The file's bytes, or a short reason it is not returned."""
        *parents, leaf = path.split("/")
        try:
            with self._walk(parents) as parent:
                flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
                fd = os.open(leaf, flags, dir_fd=parent)
        except OSError as exc:
            return wire.FetchRefused.cannot_open(exc)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return wire.FetchRefused.NOT_REGULAR
            if info.st_size > budget:
                return wire.FetchRefused.too_large(info.st_size, budget)
            chunks: list[bytes] = []
            size = 0
            while size <= budget:
                chunk = os.read(fd, min(1 << 20, budget + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > budget:
                return wire.FetchRefused.grew(budget)
            return b"".join(chunks)
        except OSError as exc:
            return wire.FetchRefused.cannot_read(exc)
        finally:
            os.close(fd)

    def remove(self) -> None:
        """Delete the directory and all the code left in it (idempotent)."""
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        _remove_tree(self.path)


CLOSE_REMOVALS_WAIT = 30.0
"""Seconds ``close()`` waits for the calls' directories still being removed: a close must
end, and the removals' thread, not a daemon's, goes on."""


class _Removals:
    """Calls' directories removed in a thread of their own, off the call's result: the
    code may have left a million names or chains of thousands of nested directories.

    Why not awaited by the call: its caller waited for the removal, 39 s for a 5 s call
    whose code spent 2 s making nested directories (thirty-fourth red-team round). The
    backend's ``close()`` waits for them, and so does the interpreter's exit (the thread
    is not a daemon's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[_Workdir] = []
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

    def remove_soon(self, workdir: _Workdir) -> None:
        with self._lock:
            self._pending.append(workdir)
            self._idle.clear()
            if self._thread is not None:
                return
            thread = threading.Thread(
                target=self._run, name="retool-exec-local-removals", daemon=False
            )
            try:
                thread.start()
            except RuntimeError:  # no thread to be had (the host's task limit): remove here
                pending, self._pending = self._pending, []
                self._idle.set()
            else:
                self._thread = thread
                return
        for left in pending:
            with contextlib.suppress(OSError):
                left.remove()

    def wait(self, seconds: float | None = None) -> bool:
        """Until every directory handed over so far is removed (at most ``seconds``):
        whether they are."""
        return self._idle.wait(seconds)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    self._idle.set()
                    return
                workdir = self._pending.pop()
            with contextlib.suppress(OSError):  # (the tree's removal itself never raises)
                workdir.remove()


def _remove_tree(path: str) -> None:
    """Remove a directory the code wrote in (``trees.remove_tree``: no recursion, no link
    followed, unreadable directories opened up); never raises."""
    trees.remove_tree(path)


# The kernel's PID_MAX_LIMIT: no pid on Linux is larger.
_PID_MAX = 1 << 22


def _is_pid(value: object) -> TypeGuard[int]:
    """Whether ``value`` can be a process id other than init's (a JSON int in range)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 < value <= _PID_MAX


def _is_fork_copy(pid: object, taken: Collection[int], channel_inode: int) -> TypeGuard[int]:
    """Whether ``pid``, as a fork's copy reported it, is the copy in the kernel's words:
    a live session leader holding the copy's end of its channel (socket ``channel_inode``),
    neither this process nor a session the backend knows (``taken``).

    The report comes from code the cell can reach; the host kills the copy's process
    group by this number later, so a number that would crash the kill, or point it at
    another session, the host, or any other process of this user, must not be taken.
    Linux only (``/proc``), like the rest of the local backend's process handling.
    """
    if not _is_pid(pid) or pid == os.getpid() or pid in taken:
        return False
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
        if len(fields) <= 3 or fields[3] != str(pid):  # the copy called setsid()
            return False
        held = f"socket:[{channel_inode}]"
        with os.scandir(f"/proc/{pid}/fd") as entries:
            return any(_link(entry.path) == held for entry in entries)
    except OSError:
        return False


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _kill_group(pid: int) -> None:
    if not _is_pid(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _failure(detail: str, started: float) -> ExecResult:
    return ExecResult.sandbox_failure(
        detail, backend=LocalSubprocessBackend.name, latency=time.perf_counter() - started
    )
