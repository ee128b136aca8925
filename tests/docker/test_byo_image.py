"""Bring your own image: a plain image with no agent inside runs the whole contract, contained.

The subject (``foreign_image.py``) is Debian bullseye with Python 3.9 and no
numpy, imported with nothing of ours: the agent arrives over the attach
stream at start. The backend contract suite and the whole security corpus
run against it, under the reuse policy; the fresh policy gets a smoke test.
"""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
from collections.abc import Iterator

import docker
import pytest

from retool_exec import Outcome, Sandbox
from retool_exec._errors import BackendUnavailableError, ImageError
from retool_exec.backends.config import DockerConfig
from retool_exec.security import (
    CORPUS,
    CaseReport,
    HostFixtures,
    Status,
    run_backend,
    with_audit_limits,
)
from retool_exec.security.runner import DEFAULT_TIMEOUT, default_concurrency
from tests.conftest import LABELS
from tests.contract import test_backend_contract as contract
from tests.docker import foreign_image

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def foreign(client: docker.DockerClient) -> str:
    return foreign_image.ensure(client)


def foreign_config(image: str, **settings: object) -> DockerConfig:
    return DockerConfig.model_validate(
        {"image": image, "pool_size": 2, "timeout": 10.0, "labels": LABELS, **settings}
    )


@pytest.fixture(scope="module")
def byo_sandbox(foreign: str) -> Iterator[Sandbox]:
    with Sandbox(foreign_config(foreign), max_workers=16) as sandbox:
        yield sandbox


class TestForeignImageContract(contract.TestBackendContract):
    """Every contract test, on the foreign image (reuse policy)."""

    @pytest.fixture()
    def sandbox(self, byo_sandbox: Sandbox) -> Sandbox:
        return byo_sandbox

    @pytest.fixture()
    def backend_id(self) -> str:
        return "docker-reuse"  # only for tests that ask which backend family runs

    test_stats_count_every_call = None  # builds its own sandbox from the backend table


def test_the_foreign_python_runs_the_calls_without_the_image_environment(
    byo_sandbox: Sandbox,
) -> None:
    result = byo_sandbox.run_code(
        "import os, sys\n"
        "print(sys.version_info[:2])\n"
        "print(sorted(k for k in os.environ if k in ('LEAKY_TOKEN', 'PYTHONPATH')))\n"
        "import numpy\n"
    )
    assert result.stdout == "(3, 9)\n[]\n"
    assert "No module named 'numpy'" in result.stderr


def test_the_fresh_policy_runs_it_too(foreign: str) -> None:
    with Sandbox(foreign_config(foreign, policy="fresh")) as sandbox:
        results = sandbox.run_many(["print(6 * 7)", "1/0", "import os; print(os.getuid() > 0)"])
    assert [r.outcome for r in results] == [Outcome.SUCCESS, Outcome.ERROR, Outcome.SUCCESS]
    assert results[0].stdout == "42\n" and results[2].stdout == "True\n"


def test_an_image_with_a_volume_is_refused_before_any_container(
    client: docker.DockerClient, foreign: str
) -> None:
    image = foreign_image.with_volume(client, foreign)
    with pytest.raises(ImageError, match="VOLUME /data"):
        Sandbox(foreign_config(image)).start()


def test_an_image_without_python_says_so(client: docker.DockerClient) -> None:
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tmp = tarfile.TarInfo("tmp")
        tmp.type, tmp.mode = tarfile.DIRTYPE, 0o1777
        tar.addfile(tmp)
    repository, tag = "retool-exec-test-foreign", "no-python"
    client.api.import_image(src=archive.getvalue(), repository=repository, tag=tag)
    try:
        with pytest.raises(BackendUnavailableError, match="no python3 on its PATH"):
            Sandbox(foreign_config(f"{repository}:{tag}", start_timeout=20)).start()
    finally:
        client.images.remove(f"{repository}:{tag}", force=True)


# -- the security corpus ---------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus_reports(foreign: str) -> dict[str, CaseReport]:
    config = with_audit_limits(foreign_config(foreign, timeout=DEFAULT_TIMEOUT))

    async def run() -> list[CaseReport]:
        with Sandbox(config, timeout=DEFAULT_TIMEOUT) as sandbox, HostFixtures() as host:
            return await run_backend(
                sandbox,
                CORPUS,
                host,
                backend="docker-reuse",
                concurrency=default_concurrency(config),
            )

    return {report.case_id: report for report in asyncio.run(run())}


FOREIGN_DIFFERENCES = {
    "priv-setuid-binaries": "the image ships setuid binaries (su, newgrp, unix_chkpwd) and is "
    "not modified; no_new_privs keeps them inert (asserted below)",
}
"""Cases a foreign image cannot pass by its content alone; images/README.md lists them."""


def _case_param(case_id: str) -> object:
    reason = FOREIGN_DIFFERENCES.get(case_id)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(case_id, id=case_id, marks=marks)


@pytest.mark.security
@pytest.mark.parametrize("case_id", [_case_param(case.id) for case in CORPUS])
def test_the_corpus_is_contained_on_the_foreign_image(
    case_id: str, corpus_reports: dict[str, CaseReport]
) -> None:
    report = corpus_reports[case_id]
    assert report.status is Status.CONTAINED, report.describe()


def test_setuid_binaries_of_a_foreign_image_are_inert(
    corpus_reports: dict[str, CaseReport],
) -> None:
    facts = json.loads(corpus_reports["priv-setuid-binaries"].evidence)
    assert facts["count"] > 0  # the image does ship some: this is the case that matters
    assert facts["no_new_privs"] == 1
