"""``--output s3://...``: shards and aggregates go to a real S3 API (moto's server) through pyarrow.fs.

pyarrow's S3 filesystem honours the standard ``AWS_ENDPOINT_URL`` (and
credentials) from the environment, so pointing a sweep at MinIO, Ceph or a
test server needs no sweeper flag.
"""

from __future__ import annotations

import threading

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, run_cli

BUCKET = "sweeps"

SWEEP = """
name: s3
models: [tiny-llama, tiny-qwen2]
backends: noop
precisions: fp32
batch_sizes: [1, 2, 3]
workload: {input_len: 8, output_len: 4}
measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 0.3, idle_s: 0}
"""


@pytest.fixture
def s3_env():
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    fs = pafs.S3FileSystem(endpoint_override=env["AWS_ENDPOINT_URL"], access_key="test", secret_key="test",
                           region="us-east-1", allow_bucket_creation=True)
    fs.create_dir(BUCKET)
    yield env, fs
    server.stop()


def _objects(fs: pafs.FileSystem, prefix: str) -> list[pafs.FileInfo]:
    return [i for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True)) if i.is_file]


def _watch(fs: pafs.FileSystem, prefix: str, stop: threading.Event, seen: set[str], broken: list[str]) -> None:
    """Read back every shard as soon as it is listed: a partial object would fail to parse."""
    while not stop.is_set():
        for info in _objects(fs, prefix):
            if info.path in seen:
                continue
            try:
                pq.read_table(info.path, filesystem=fs)
                seen.add(info.path)
            except Exception as exc:  # noqa: BLE001 - any failure to read is the finding
                broken.append(f"{info.path}: {exc}")
                seen.add(info.path)
        stop.wait(0.05)


@pytest.mark.slow
def test_a_sweep_writes_to_s3_and_aggregate_reads_it_back(s3_env, tmp_path):
    env, fs = s3_env
    sweep = tmp_path / "s3.yaml"
    sweep.write_text(SWEEP)
    uri = f"s3://{BUCKET}/results/s3"
    # The store's endpoint and credentials are the driver's alone: the driver writes every
    # shard and aggregate, the actors only return their results. So the runs join the session's
    # Ray head with them in the driver's environment only (tests.conftest.run_cli).
    cli = {"env": env, "driver_env": True}

    stop, seen, broken = threading.Event(), set(), []
    watcher = threading.Thread(target=_watch, args=(fs, f"{BUCKET}/results/s3/shards", stop, seen, broken),
                               daemon=True)
    watcher.start()
    try:
        r = run_cli("run", str(sweep), "-o", uri, "-q", **cli)
    finally:
        stop.set()
        watcher.join()
    assert r.returncode == 0, r.stderr[-3000:]
    assert not broken, broken  # no shard was ever visible before it was whole
    assert len([p for p in seen if "/shards/trials/" in p]) == 6

    keys = [i.path for i in _objects(fs, f"{BUCKET}/results/s3")]
    # Parquet objects and the plan record only: no temporary object, no lock left behind.
    assert all((k.endswith(".parquet") or k.endswith("/plan.json")) and not k.rsplit("/", 1)[-1].startswith(".")
               for k in keys), keys
    assert f"{BUCKET}/results/s3/trials.parquet" in keys
    assert not any((ROOT / p).exists() for p in ("s3:", f"s3:/{BUCKET}"))  # nothing went to a local dir

    agg = run_cli("aggregate", uri, env=env)
    assert agg.returncode == 0, agg.stderr[-3000:]
    assert "trials.parquet: 6 rows" in agg.stdout and "requests.parquet: 0 rows" not in agg.stdout
    rows = pq.read_table(f"{BUCKET}/results/s3/trials.parquet", filesystem=fs).to_pylist()
    assert sorted((r["model"], r["batch_size"], r["status"]) for r in rows) == sorted(
        (m, b, "ok") for m in ("tiny-llama", "tiny-qwen2") for b in (1, 2, 3))

    again = run_cli("run", str(sweep), "-o", uri, "-q", **cli)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "6 trial(s) already ok; 0 to run" in again.stderr  # resume reads the shards from S3
