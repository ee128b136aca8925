"""Images built from specs, for real: an extended image and the datascience preset.

Each image is built once per machine and then found by its content-addressed
tag (the mmdebstrap base is cached apart from the agent layer, so a changed
agent costs seconds, not a rebuild). First builds on this 2-core machine: the
extended image about 50 s, the datascience preset about 60 s.
"""

from __future__ import annotations

import docker
import pytest

from retool_exec import Outcome, Sandbox
from retool_exec.backends.config import DockerConfig
from retool_exec.backends.docker import image as image_mod
from retool_exec.backends.docker import image_inputs
from retool_exec.backends.docker.image_spec import ImageSpec
from tests.conftest import LABELS

pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

EXTENDED = ImageSpec(apt=("python3-tabulate",), pip=("tomli-w==1.0.0",))
"""One extra Debian package and one small PyPI package."""
USES_BOTH = (
    "import tabulate, tomli_w\n"
    "print(tomli_w.dumps({'a': 1}).strip(), tabulate.tabulate([[1, 2]], tablefmt='plain'))\n"
)


@pytest.fixture(scope="module")
def extended(client: docker.DockerClient) -> image_mod.ImageInfo:
    return image_mod.build_image(client, EXTENDED, progress=print)


def test_the_extended_image_records_what_it_holds(
    client: docker.DockerClient, extended: image_mod.ImageInfo
) -> None:
    assert extended.tag == image_inputs.image_tag(EXTENDED) != image_inputs.image_tag()
    assert extended.spec == "math +apt python3-tabulate +pip tomli-w==1.0.0"
    assert extended.pip == ("tomli_w==1.0.0",)
    assert image_mod.is_current(extended)
    listed = {info.tag: info for info in image_mod.list_images(client)}
    assert listed[extended.tag].pip == ("tomli_w==1.0.0",)
    again = image_mod.build_image(client, EXTENDED)
    assert again.built is False and again.id == extended.id


@pytest.mark.parametrize("policy", ["reuse", "fresh"])
def test_code_importing_both_runs(extended: image_mod.ImageInfo, policy: str) -> None:
    config = DockerConfig(image_spec=EXTENDED, policy=policy, pool_size=1, labels=LABELS)
    with Sandbox(config) as sandbox:
        result = sandbox.run_code(USES_BOTH)
        assert result.outcome is Outcome.SUCCESS, result.stderr
        assert result.stdout == "a = 1 1  2\n"
        # pip is gone once the build is done: the sandbox has nothing to install with.
        gone = sandbox.run_code("import pip")
        assert "No module named 'pip'" in gone.stderr


def test_the_default_image_does_not_have_the_extras(extended: image_mod.ImageInfo) -> None:
    with Sandbox(DockerConfig(pool_size=1, labels=LABELS)) as sandbox:
        result = sandbox.run_code(USES_BOTH)
    assert "No module named 'tabulate'" in result.stderr


@pytest.mark.slow
def test_the_datascience_preset_runs_sandboxfusion_style_code(
    client: docker.DockerClient,
) -> None:
    spec = ImageSpec(preset="datascience")
    image_mod.build_image(client, spec, progress=print)
    code = (
        "import pandas as pd, networkx as nx, matplotlib.pyplot as plt, seaborn, statsmodels\n"
        "from sklearn.linear_model import LinearRegression\n"
        "df = pd.DataFrame({'x': [1, 2, 3], 'y': [2, 4, 6]})\n"
        "coef = LinearRegression().fit(df[['x']], df['y']).coef_[0]\n"
        "g = nx.path_graph(4)\n"
        "fig, ax = plt.subplots(); ax.plot(df.x, df.y); fig.savefig('plot.png')\n"
        "import matplotlib, os\n"
        "print(round(float(coef), 6), nx.shortest_path_length(g, 0, 3), matplotlib.get_backend(),"
        " os.path.getsize('plot.png') > 1000)\n"
    )
    config = DockerConfig(image_spec=spec, pool_size=1, labels=LABELS)
    with Sandbox(config) as sandbox:
        results = sandbox.run_many([code, code])
    for result in results:
        assert result.outcome is Outcome.SUCCESS, result.stderr
        assert result.stdout == "2.0 3 agg True\n"
        assert result.stderr == ""  # no matplotlib warning about its cache directory
