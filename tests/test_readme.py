"""The README's two commands exist, and CI runs the test one."""

import re

from support import cache

README = (cache.REPO / "README.md").read_text()


def command(name: str) -> str:
    match = re.search(rf"<!-- command: {name} -->\n```bash\n(.+?)\n```", README)
    assert match, f"README has no '{name}' command block"
    return match.group(1)


def test_main_command_installs_and_runs_the_first_version():
    main = command("main")
    assert main.startswith('pip install -e ".[gpu]"') and "python matmul_v1.py" in main
    assert "gpu = [" in (cache.REPO / "pyproject.toml").read_text()
    assert (cache.REPO / "matmul_v1.py").exists()


def test_test_command_installs_the_test_extra_and_runs_pytest():
    test = command("test")
    assert 'pip install -e ".[test]"' in test and "pytest" in test
    assert "test = [" in (cache.REPO / "pyproject.toml").read_text()


def test_ci_runs_the_test_command_after_the_cpu_torch():
    ci = (cache.REPO / ".ci" / "run").read_text().splitlines()
    assert command("test") in ci
    assert ci.index("pip install torch==2.13.0") < ci.index(command("test"))
