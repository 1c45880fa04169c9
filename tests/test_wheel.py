"""The built wheel, installed in a fresh virtual environment, finds its templates and tuning database."""

import site
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHECK = textwrap.dedent("""
    import sys
    import autoflash
    from autoflash.resources import data_dir
    from autoflash.dispatch import Dispatcher, shipped_urls
    from autoflash import codegen
    from autoflash.families.tl.knobs import FwdKnobs
    package = autoflash.__file__.rsplit("/", 1)[0]
    assert package.startswith(sys.prefix), (package, sys.prefix)
    assert str(data_dir("templates")).startswith(package) and str(data_dir("tuning_db")).startswith(package)
    assert shipped_urls(), "the wheel carries no tuning database"
    records = Dispatcher(shipped_urls()).sources("h100")[0][1]
    assert len(records) >= 48, len(records)
    assert "def _attn_fwd(" in codegen.render(FwdKnobs())
    print("wheel ok", len(records))
""")


def test_wheel_carries_templates_and_tuning_db(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                    "-w", str(tmp_path / "dist")], check=True)
    wheel = next((tmp_path / "dist").glob("autoflash-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # torch, triton and the rest come from this environment, listed after the venv's own packages;
    # .pth files there (an editable autoflash) are not read, so `import autoflash` finds the wheel.
    site_packages = next((venv / "lib").glob("python*/site-packages"))
    (site_packages / "parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    done = subprocess.run([venv / "bin" / "python", "-c", CHECK], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and "wheel ok" in done.stdout, done.stderr
