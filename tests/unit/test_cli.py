"""The command line, in-process with click's runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from bergstream.core import __version__
from bergstream.core.cli import cli

GOOD = """
virtual_clusters:
  - name: demo
    target: {bootstrap: "${KAFKA:-127.0.0.1:9092}"}
    gateway: {port: 19092}
"""


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_config_check_good(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    result = CliRunner().invoke(cli, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "OK (1 virtual cluster(s), 0 filter(s), 0 service(s))" in result.output


def test_config_check_bad_lists_every_problem(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("19092", "nope") + "    filters: [{type: no-such-filter}]\n")
    result = CliRunner().invoke(cli, ["config", "check", str(path)])
    assert result.exit_code == 1
    assert f"{path}:5: virtual_clusters[0].gateway.port" in result.output
    assert "virtual_clusters[0].filters[0].type: no filter plugin named 'no-such-filter'" in (
        result.output
    )
    assert "2 problem(s)" in result.output


def test_config_check_missing_file(tmp_path):
    result = CliRunner().invoke(cli, ["config", "check", str(tmp_path / "none.yaml")])
    assert result.exit_code == 1
    assert "cannot read the file" in result.output


def test_run_refuses_a_bad_config(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("virtual_clusters: 3\n")
    result = CliRunner().invoke(cli, ["run", "-c", str(path)])
    assert result.exit_code == 1
    assert "virtual_clusters" in result.output


def test_plugins_lists_json():
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0
    assert result.output.strip().startswith("[")


def test_plugins_list_the_commands_and_log_components_they_add():
    infos = {
        i["name"]: i for i in json.loads(CliRunner().invoke(cli, ["plugins", "--json"]).output)
    }
    registers = {
        name: {(r["kind"], r["name"]) for r in info["registers"]} for name, info in infos.items()
    }
    assert {("command", "stack"), ("command", "quickstart")} <= registers["devstack"]
    assert {("command", "pipeline"), ("command", "table")} <= registers["pipeline"]
    assert ("config section", "lake.pipeline") in registers["pipeline"]
    assert ("log component", "pipeline") in registers["pipeline"]
    assert ("log component", "isk") in registers["isk"]


def test_run_reports_a_start_failure_in_one_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = tmp_path / "busy.yaml"
        path.write_text(
            "virtual_clusters:\n  - name: busy\n    target: {bootstrap: '127.0.0.1:9'}\n"
            f"    gateway: {{port: {port}, broker_start_port: {port + 10}}}\n"
        )
        result = CliRunner().invoke(cli, ["run", "-c", str(path)])
    assert result.exit_code == 1
    assert f"{path}: cannot start:" in result.output
    assert "Traceback" not in result.output


BERGSTREAM = str(Path(sys.executable).parent / "bergstream")
REPO = Path(__file__).resolve().parents[2]


def test_core_cli_imports_nothing_of_the_dev_stack():
    code = (
        "import sys, bergstream.core.cli; "
        "loaded = sorted(m for m in sys.modules if m.startswith('bergstream.devstack')); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_stack_and_quickstart_come_from_the_devstack_plugin():
    plugins = json.loads(
        subprocess.run(
            [BERGSTREAM, "plugins", "--json"], capture_output=True, text=True, check=True
        ).stdout
    )
    devstack = next(p for p in plugins if p["name"] == "devstack")
    assert devstack["hooks"] == ["register_commands", "register_log_components"]
    for args, expected in (
        (["stack", "--help"], ["down", "env", "status", "up"]),
        (
            ["stack", "up", "--help"],
            [
                "--component [kafka|s3|redis|schema-registry|postgres|connect|kdc|oidc|"
                "rest-catalog]",
                "--sasl-mechanism [scram-sha-512|oauthbearer|gssapi]",
            ],
        ),
        (["quickstart", "--help"], ["--records", "--cold-fraction", "--proxy-port"]),
    ):
        done = subprocess.run([BERGSTREAM, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert all(word in done.stdout for word in expected), done.stdout


def test_stack_commands_on_a_home_without_a_stack(tmp_path):
    env = {**os.environ, "BERGSTREAM_HOME": str(tmp_path)}

    def bergstream(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BERGSTREAM, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    status = bergstream("stack", "status")
    assert status.returncode == 0, status.stderr
    assert {name: c["running"] for name, c in json.loads(status.stdout).items()} == {
        "redis": False,
        "s3": False,
        "kafka": False,
        "schema-registry": False,
        "postgres": False,
        "connect": False,
        "kdc": False,
        "oidc": False,
        "rest-catalog": False,
    }
    missing = bergstream("stack", "env")
    assert missing.returncode == 1
    assert "the local stack is not up" in missing.stderr
    down = bergstream("stack", "down")
    assert down.returncode == 0 and down.stdout.strip() == "stopped: nothing was running"


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_version_loads_no_plugin_and_no_config_machinery():
    loaded = _modules_after(
        "from bergstream.core.cli import cli\n"
        "try:\n    cli(['--version'], prog_name='bergstream')\nexcept SystemExit:\n    pass"
    )
    assert "bergstream.core.plugins" not in loaded
    assert "pydantic" not in loaded
    assert not {m for m in loaded if m.startswith("bergstream.plugins")}


def test_help_lists_plugin_commands_without_loading_the_services(tmp_path):
    done = subprocess.run(
        [BERGSTREAM, "--help"], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    for command in ("config", "run", "plugins", "pipeline", "table", "stack", "quickstart"):
        assert f"  {command} " in done.stdout, command
    # kio (the proxy's protocol library) imports hypothesis when it is installed, which
    # leaves a .hypothesis folder in the working directory: --help must not get that far.
    assert not (tmp_path / ".hypothesis").exists()
    loaded = _modules_after(
        "from bergstream.core.cli import cli\n"
        "try:\n    cli(['--help'], prog_name='bergstream')\nexcept SystemExit:\n    pass"
    )
    heavy = {
        "aiohttp", "kio", "hypothesis", "pyspark", "minio", "redis", "rocksdict",
        "numpy", "pyarrow", "numba", "pyiceberg", "orjson", "google.protobuf",
    }  # fmt: skip
    assert heavy & loaded == set()


def test_an_unknown_command_still_says_so():
    result = CliRunner().invoke(cli, ["no-such-command"])
    assert result.exit_code == 2
    assert "No such command 'no-such-command'" in result.output


def test_a_command_that_loads_the_proxy_leaves_no_hypothesis_folder(tmp_path):
    # kio imports hypothesis when it is installed (as here), and hypothesis makes a storage
    # folder on first use: the command hides hypothesis from kio.
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env |= {
        "BERGSTREAM_CACHE": str(tmp_path / "cache"),
        "BERGSTREAM_HOME": str(tmp_path / "home"),
        "BERGSTREAM_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    }
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [BERGSTREAM, "config", "check", str(REPO / "examples" / "ksi.yaml")],
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert list(work.iterdir()) == []
    assert not (tmp_path / "cache" / "hypothesis").exists()
