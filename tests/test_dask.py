"""The Dask engine: a run on a real LocalCluster of worker processes equals the local run,
instruction for instruction, and a worker killed mid-run loses nothing."""

from __future__ import annotations

import os
import signal
import threading
import time

import distributed
import pytest

from relocverify.engine.run import RunOptions, run
from relocverify.image.fetch import fetch
from relocverify.image.loader import load_image
from relocverify.store.store import Results


TRAMP = 0xFFFFFFFFC0001000
LIMIT = 160  # functions: about 10,000 instructions, a few hundred distinct proofs


@pytest.fixture(scope="module")
def vmlinux():
    return load_image(fetch("debian-6.1-cloud").vmlinux)


@pytest.fixture(scope="module")
def local_rows(vmlinux, tmp_path_factory):
    db = tmp_path_factory.mktemp("local") / "store.sqlite"
    summary = run(vmlinux, str(db), RunOptions(TRAMP, 2, 10.0, LIMIT, True, None))
    assert summary["totals_add_up"]
    return summary, _rows(db)


def _rows(db) -> list[tuple]:
    store = Results(str(db))
    try:
        image = store.find_image()
        return [(r.address, r.length, r.raw, r.verdict, r.method, r.plan_kind, r.rule, r.klass, r.reason, r.sites)
                for r in store.iter_rows(image)]
    finally:
        store.close()


@pytest.fixture()
def cluster(tmp_path):
    import logging

    import dask

    with dask.config.set({"temporary-directory": str(tmp_path)}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                     memory_limit=0, silence_logs=logging.ERROR, local_directory=str(tmp_path)) as c:
        yield c


@pytest.mark.slow
def test_a_dask_local_cluster_run_equals_the_local_run(vmlinux, local_rows, tmp_path):
    summary, expected = local_rows
    db = tmp_path / "dask.sqlite"
    got = run(vmlinux, str(db), RunOptions(TRAMP, 2, 10.0, LIMIT, True, None, dask_local=2))
    assert got["totals_add_up"] and got["run"]["status"] == "complete"
    assert got["by_verdict"] == summary["by_verdict"]
    assert _rows(db) == expected  # instruction for instruction: verdict, method, plan, rule, reason, sites


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_nothing(vmlinux, local_rows, cluster, tmp_path):
    summary, expected = local_rows
    client = distributed.Client(cluster.scheduler_address)
    before = client.run(os.getpid)  # worker address -> pid
    killed: list[int] = []

    def kill_one_busy_worker():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            busy = [addr for addr, keys in client.processing().items() if keys and addr in before]
            if busy and any(k.startswith(("survey", "prove")) for k in client.processing()[busy[0]]):
                os.kill(before[busy[0]], signal.SIGKILL)
                killed.append(before[busy[0]])
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_busy_worker, daemon=True)
    killer.start()
    db = tmp_path / "dask.sqlite"
    got = run(vmlinux, str(db), RunOptions(TRAMP, 2, 10.0, LIMIT, True, None,
                                           scheduler=cluster.scheduler_address))
    killer.join(timeout=5)
    assert killed, "no worker was busy to kill: the run ended before the test could kill one"
    after = client.run(os.getpid)
    assert killed[0] not in after.values()  # the nanny started a new process in its place
    client.close()
    assert got["totals_add_up"] and got["run"]["status"] == "complete"
    assert got["by_verdict"] == summary["by_verdict"]
    assert _rows(db) == expected


def test_a_bad_scheduler_address_is_a_one_line_error(capsys):
    from relocverify.cli import main

    code = main(["vmlinux", "--scheduler", "not an address", "--db", "x.sqlite"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--scheduler" in err and "Traceback" not in err


def test_a_scheduler_that_never_answers_is_not_waited_on_for_ever(tmp_path, capsys):
    """A server that accepts the connection and says nothing (issue 44: waited on for ever): one line, exit 2,
    within the scheduler's wait."""
    import socket
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    import elfbuild
    import test_engine

    from relocverify.cli import main
    from relocverify.schedule.dask_pool import SCHEDULER_WAIT_S

    image = str(elfbuild.build_elf(tmp_path, test_engine.SMALL_ASM, test_engine.SMALL_LDS))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    t0 = time.monotonic()
    try:
        code = main(["vmlinux", image, "--db", str(tmp_path / "s.sqlite"), "--no-progress", "--scheduler",
                     f"tcp://127.0.0.1:{server.getsockname()[1]}"])
    finally:
        stop.set()
        server.close()
        for c in held:
            c.close()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "did not answer" in err, err
    assert time.monotonic() - t0 < SCHEDULER_WAIT_S + 8
