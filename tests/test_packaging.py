"""The distribution: built as a wheel and an sdist, checked by twine, installed into a
clean venv where the `opto` command works; and `opto --version` naming clashes."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import opto
from opto._util.installed import other_distributions, version_text
from opto._version import DISTRIBUTION
from opto.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_version_flag_prints_the_distribution_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{DISTRIBUTION} {opto.__version__} ")
    assert "warning" not in out
    assert importlib.metadata.version(DISTRIBUTION) == opto.__version__


def test_version_names_another_package_that_installs_opto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What `pip install trace-opt` leaves in site-packages: a RECORD listing opto/ files.
    info = tmp_path / "trace_opt-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trace-opt\nVersion: 0.2.0\n")
    (info / "RECORD").write_text(
        "opto/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n"
        "opto/trace/nodes.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n"
        "trace_opt-0.2.0.dist-info/RECORD,,\n"
    )
    for file in ("opto/__init__.py", "opto/trace/nodes.py"):  # some readers skip files not on disk
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text("")
    assert other_distributions([str(tmp_path)]) == ["trace-opt"]
    monkeypatch.syspath_prepend(str(tmp_path))  # as if installed: `opto --version` warns
    text = version_text()
    assert "warning: trace-opt 0.2.0 is also installed" in text
    assert "pip uninstall trace-opt" in text


def _run(*command: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_wheel_and_sdist_build_pass_twine_and_install_into_a_clean_venv(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="the dev extra installs build and twine")
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
    wheels = list(dist.glob("opto_agents-*.whl"))
    sdists = list(dist.glob("opto_agents-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(dist.iterdir())
    assert "PASSED" in _run(sys.executable, "-m", "twine", "check", *wheels, *sdists)

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    _run(python, "-m", "pip", "install", "--quiet", wheels[0])
    version = _run(env / "bin" / "opto", "--version", cwd=tmp_path)
    assert version.startswith(f"{DISTRIBUTION} {opto.__version__} (import name opto, at {env}"), version
    assert "warning" not in version
    assert "--finetune" in _run(env / "bin" / "opto", "demo", "--help", cwd=tmp_path)
    # The wheel carries the prompts, the BIG-bench data and the type marker.
    shipped = _run(python, "-c", "import opto, pathlib; p = pathlib.Path(opto.__file__).parent; "
                   "print(sorted(x.name for x in p.glob('_prompts/*'))[:1], (p / 'py.typed').exists(), "
                   "len(list((p / 'datasets' / 'bigbench_data').glob('*.json'))))", cwd=tmp_path)
    assert "True" in shipped and "[]" not in shipped
