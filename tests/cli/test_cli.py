"""The command lines as a user types them: help, versions, paths with ~, `mwrt config`, and the
warnings about mistyped MWRT_* variables; every output is parsed, in real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.support import machine
from tests.support.daemons import start_worker, stop_worker

import mwrt
from mwrt import config

CLIS = {"mwrt": ["-m", "mwrt.cli"], "mwrt-worker": ["-m", "mwrt.worker"],
        "mwrt-launch": ["-m", "mwrt.distributed.launch"]}


def run(cli: str, *args, env=None, cwd=None, timeout=None) -> subprocess.CompletedProcess:
    """`cli ARGS` with MWRT_* variables only from `env` (the test's own would leak in); it
    must end within 60 s on a quiet machine, more under load."""
    timeout = machine.seconds(60, 480) if timeout is None else timeout
    base = {k: v for k, v in os.environ.items() if not k.startswith("MWRT_")}
    root = os.path.dirname(os.path.dirname(os.path.abspath(mwrt.__file__)))
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [root, base.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *CLIS[cli], *args], capture_output=True, text=True,
                          env={**base, **(env or {})}, cwd=cwd, timeout=timeout)


def settings_table(stdout: str) -> dict[str, dict]:
    """`mwrt config`'s table, parsed: setting name -> its columns."""
    lines = stdout.splitlines()
    header = lines[0].split()
    assert header == ["SETTING", "VARIABLE", "SOURCE", "VALUE"], lines[0]
    rows = {}
    for line in lines[1:]:
        if not line.startswith(("unknown variable", "error:")):
            name, variable, source, value = line.split(None, 3)
            rows[name] = {"variable": variable, "source": source, "value": value}
    return rows


@pytest.mark.parametrize("argv", [["mwrt"], ["mwrt-worker"], ["mwrt-worker", "keygen"],
                                  ["mwrt-launch"]], ids=" ".join)
def test_every_cli_has_a_version(argv):
    result = run(*argv, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1].strip("()") == config.version() or \
        f"mwrt {config.version()}" in result.stdout, result.stdout


def test_keygen_help_is_help_and_makes_no_folder(tmp_path):
    result = run("mwrt-worker", "keygen", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: mwrt-worker keygen") and "DIR" in result.stdout
    assert os.listdir(tmp_path) == []
    usage = run("mwrt-worker", "keygen", cwd=tmp_path)  # no DIR: a usage error, no files
    assert usage.returncode == 2 and "required: DIR" in usage.stderr
    assert os.listdir(tmp_path) == []


def test_worker_help_names_the_keygen_subcommand():
    result = run("mwrt-worker", "--help")
    assert result.returncode == 0, result.stderr
    assert "mwrt-worker keygen DIR" in result.stdout and "--version" in result.stdout


@pytest.mark.quick
def test_mwrt_without_a_subcommand_lists_them():
    result = run("mwrt")
    assert result.returncode == 2 and "config" in result.stderr


@pytest.mark.parametrize("spelling", ["~/keys", "$KEYS_HOME/keys", "${KEYS_HOME}/keys"])
def test_keygen_expands_home_and_variables(tmp_path, spelling):
    env = {"HOME": str(tmp_path), "KEYS_HOME": str(tmp_path)}
    result = run("mwrt-worker", "keygen", spelling, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "keys")) == ["master.key", "worker.key"]
    assert os.listdir(tmp_path) == ["keys"]  # no folder literally named '~' or '$KEYS_HOME'


@pytest.mark.quick
def test_config_lists_every_setting_with_value_and_source():
    result = run("mwrt", "config", env={"MWRT_SYNC_TIMEOUT": "7", "MWRT_CHANNEL": "tcp"})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = settings_table(result.stdout)
    assert set(rows) == set(config.SETTINGS)
    for name, setting in config.SETTINGS.items():
        assert rows[name]["variable"] == setting.env
    assert rows["sync_timeout"]["source"] == "environment" and rows["sync_timeout"]["value"] == \
        "7.0"
    assert rows["channel"]["value"] == "'tcp'" and rows["batch_size"]["source"] == "default"
    assert rows["batch_size"]["value"] == repr(config.SETTINGS["batch_size"].default)


def test_config_json_and_expanded_paths(tmp_path):
    env = {"HOME": str(tmp_path), "MWRT_KEY_FILE": "~/keys/master.key",
           "MWRT_REGISTRY": "$HOME/registry"}
    result = run("mwrt", "config", "--json", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    values = {row["name"]: row for row in data["settings"]}
    assert values["key_file"]["value"] == str(tmp_path / "keys" / "master.key")
    assert values["registry"]["value"] == str(tmp_path / "registry")
    assert values["key_file"]["source"] == "environment" and data["unknown"] == []


def test_config_reports_a_malformed_value():
    result = run("mwrt", "config", env={"MWRT_BATCH_SIZE": "many"})
    assert result.returncode == 1
    assert "error: MWRT_BATCH_SIZE: not a valid int (got 'many')" in result.stdout


def test_mistyped_variable_is_named_with_the_closest_setting():
    env = {"MWRT_SYNC_TIMOUT": "3", "MWRT_ZZZ": "1", "MWRT_RUN_DIR": "/tmp"}  # the last: a
    # variable of worker/slurm_workers.sh, not a typo
    result = run("mwrt", "config", env=env)
    assert result.returncode == 1
    lines = [line for line in result.stdout.splitlines() if line.startswith("unknown variable")]
    assert lines == ["unknown variable MWRT_SYNC_TIMOUT: ignored; did you mean MWRT_SYNC_TIMEOUT?",
                     "unknown variable MWRT_ZZZ: ignored; no setting is named like it"]


def test_any_mwrt_process_warns_once_about_a_mistyped_variable(tmp_path):
    """The warning comes at the first setting read, once per process, on stderr."""
    result = run("mwrt-worker", "keygen", str(tmp_path / "k"), env={"MWRT_KEYFILE": "x"})
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "MWRT_KEYFILE" in line]
    assert len(warnings) == 1 and "did you mean MWRT_KEY_FILE?" in warnings[0], result.stderr


def test_worker_env_file_typo_is_warned_about(tmp_path):
    env_file = tmp_path / "worker.env"
    env_file.write_text("MWRT_LOG_LEVEL=INFO\nMWRT_SESION_BYTES=1000000\n")
    process, _ = start_worker("--env-file", str(env_file))
    process.terminate()
    _, log = process.communicate(timeout=10)
    warnings = [line for line in log.splitlines() if "SESION" in line]
    assert warnings == [f"{env_file}: MWRT_SESION_BYTES: not an mwrt setting, ignored; did you "
                        "mean MWRT_SESSION_BYTES?"], log


def test_readme_recipe_with_tilde_in_the_key_file(tmp_path):
    """Keys made under ~ and named with ~ in --key-file and MWRT_KEY_FILE, as the README
    writes them: a master computes on the keyed worker."""
    env = {"HOME": str(tmp_path)}
    assert run("mwrt-worker", "keygen", "~/mwrt-keys", env=env).returncode == 0
    base = {k: v for k, v in os.environ.items() if not k.startswith("MWRT_")}
    worker = subprocess.Popen(
        [sys.executable, "-m", "mwrt.worker", "--listen", "127.0.0.1:0", "--key-file",
         "~/mwrt-keys/worker.key"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**base, **env})
    try:
        line = worker.stdout.readline()
        assert "listening on" in line, worker.stderr.read() if worker.poll() is not None else line
        script = ("import mwrt; mwrt.init_master_worker([%r], timeout=10); "
                  "print(float(mwrt.ones(3).sum())); mwrt.shutdown()" % line.split()[-1])
        master = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                env={**base, **env, "MWRT_KEY_FILE": "~/mwrt-keys/master.key"},
                                timeout=60)
        assert master.returncode == 0 and master.stdout.strip() == "3.0", master.stderr
        # `mwrt status --workers ...`, as the README shows it: a keyed worker needs --key
        address = line.split()[-1].removeprefix("tcp://")
        keyless = run("mwrt", "status", "--workers", address, env=env)
        assert keyless.returncode == 1 and "--key to `mwrt status`" in keyless.stderr, \
            keyless.stderr
        keyed = run("mwrt", "status", "--workers", address, "--key", "~/mwrt-keys/master.key",
                    env=env)
        assert keyed.returncode == 0 and address in keyed.stdout, keyed.stderr
    finally:
        stop_worker(worker)


def test_status_shows_each_worker_as_a_table_and_as_json():
    """`mwrt status --workers A,B`: one row per daemon (its pid, memory, GPUs); --json too."""
    workers = [start_worker(env={"MWRT_FAKE_GPUS": str(i)}) for i in (0, 1)]
    try:
        listed = ",".join(address.removeprefix("tcp://") for _, address in workers)
        res = run("mwrt", "status", "--workers", listed)
        assert res.returncode == 0, res.stderr[-2000:]
        lines = res.stdout.splitlines()
        assert lines[0].split()[:4] == ["NODE", "ADDRESS", "HOST", "PID"]
        for (proc, _), line in zip(workers, lines[1:]):
            assert str(proc.pid) in line.split() and "MiB" in line, line
        rows = json.loads(run("mwrt", "status", "--workers", listed, "--json").stdout)
        assert "free" in lines[2]  # node 1 has a (fake) GPU; node 0 only a real one, if any
        assert lines[1].rstrip().endswith("-") == (not rows[0]["worker"]["gpus"]), lines[1]
        assert [row["worker"]["pid"] for row in rows] == [proc.pid for proc, _ in workers]
        assert rows[0]["worker"]["rss"] > 0 and len(rows[1]["worker"]["gpus"]) == 1
        assert rows[0]["session"]["tensors"] == 0 and rows[0]["lost"] is None
    finally:
        for proc, _ in workers:
            stop_worker(proc)


def test_status_of_a_registry_shows_the_workers_registered_in_it(tmp_path):
    """MWRT_REGISTRY alone names the workers for `mwrt status`, as its help and deploy.md
    say: it shows every daemon registered now (it failed 'num_workers: must be an int >= 1'
    unless MWRT_NUM_WORKERS said how many there were); an empty one is said so."""
    registry = str(tmp_path / "registry")
    empty = run("mwrt", "status", env={"MWRT_REGISTRY": registry})
    assert empty.returncode == 2 and "no worker registered" in empty.stderr, empty.stderr
    workers = [start_worker("--register", registry) for _ in range(2)]
    try:
        for proc, _ in workers:
            assert "registered in" in proc.stdout.readline()
        res = run("mwrt", "status", "--json", env={"MWRT_REGISTRY": registry})
        assert res.returncode == 0, res.stderr[-2000:]
        pids = sorted(row["worker"]["pid"] for row in json.loads(res.stdout))
        assert pids == sorted(proc.pid for proc, _ in workers)
    finally:
        for proc, _ in workers:
            stop_worker(proc)


def test_status_of_a_worker_nobody_runs_says_so():
    res = run("mwrt", "status", "--workers", "127.0.0.1:9", env={"MWRT_CONNECT_TIMEOUT": "1"})
    assert res.returncode == 1 and "mwrt status:" in res.stderr and "127.0.0.1:9" in res.stderr


@pytest.mark.parametrize("command", ["status", "dashboard"])
def test_status_without_workers_named_says_so_and_starts_none(command):
    """It started two daemons of its own and showed them (up 0 s, no work), not a script's."""
    res = run("mwrt", command)  # (run() passes no MWRT_ variable of the test's)
    assert res.returncode == 2 and f"mwrt {command}: no workers named" in res.stderr
    assert "mwrt.status()" in res.stderr and not res.stdout
