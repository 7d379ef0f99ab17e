"""s3:// against local disk: the same `prepare`, default flags, local -> local and s3 -> s3 (the
input uploaded once), alternated for ROUNDS rounds on a real S3 server on this machine
(scripts/cluster.sh up s3; its AWS_* exports in the environment). Prints each run's wall time,
the medians and their ratio, and the store requests of the last s3 run.

    eval "$(scripts/cluster.sh env s3)"
    .venv/bin/python bench/object_store.py [INPUT_FOLDER] [--rounds N] [--rust N] [--warc K]
Default input: ../shared/data/html_extraction (623 real pages and their gold files); --rust N:
N Rust documentation pages, chosen and staged as bench/scaling.py does (compare_datatrove's set);
--warc K: the pages packed K to a WARC.gz file first (HTTP response records), as crawls ship
them: one object per K pages instead of one per page; --latency-ms L: the s3 runs through a proxy
(tests/throttling_proxy.py) that holds every request L ms, as a store in a region answers."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3

REPO = Path(__file__).resolve().parent.parent
BUCKET = os.environ.get("S3_BUCKET", "tokenmill")


def run(inp: str, out: str, env: dict | None = None) -> float:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "tokenmill.cli", "prepare", "--input", inp, "--output", out, "--quiet"],
                       capture_output=True, text=True, cwd=REPO, env=env)
    if r.returncode:
        sys.exit(r.stderr[-2000:])
    return time.perf_counter() - t


def pack_warc(src: Path, dst: Path, per_file: int) -> str:
    """Every .html/.html.gz page under ``src`` as an HTTP response record, ``per_file`` to a WARC.gz."""
    import gzip
    import io

    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    pages = sorted(f for f in src.rglob("*") if f.is_file() and f.name.endswith((".html", ".html.gz", ".htm")))
    dst.mkdir(parents=True)
    for i in range(0, len(pages), per_file):
        with open(dst / f"part-{i // per_file:05d}.warc.gz", "wb") as fh:
            writer = WARCWriter(fh, gzip=True)
            for f in pages[i:i + per_file]:
                body = f.read_bytes()
                body = gzip.decompress(body) if f.name.endswith(".gz") else body
                headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html")], protocol="HTTP/1.1")
                url = f"https://bench.invalid/{f.relative_to(src).as_posix()}"
                writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body),
                                                              http_headers=headers))
    print(f"{len(pages)} pages packed {per_file} to a WARC.gz file: {len(list(dst.iterdir()))} files")
    return str(dst)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("input", nargs="?", default=str(REPO.parent / "shared" / "data" / "html_extraction"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rust", type=int, default=0, help="N Rust doc pages instead of INPUT_FOLDER")
    ap.add_argument("--warc", type=int, default=0, help="pack the pages K to a WARC.gz file")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="the s3 runs through a proxy that holds every request this long (a store in a region "
                         "answers in 10-50 ms; on loopback ~1 ms); the proxy's own CPU shares the 2 cores")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tokenmill-bench-")
    if args.rust:
        sys.path.insert(0, str(REPO / "bench"))
        import scaling

        args.input = str(Path(tmp) / f"rust-{args.rust}")
        scaling.stage(scaling.pick_spread(scaling.rust_doc_pages(), args.rust), Path(args.input))
    if args.warc:
        args.input = pack_warc(Path(args.input), Path(tmp) / f"warc-{args.warc}", args.warc)
    if "AWS_ENDPOINT_URL" not in os.environ:
        sys.exit('no store: scripts/cluster.sh up s3 && eval "$(scripts/cluster.sh env s3)"')
    c = boto3.client("s3")
    src = Path(args.input)
    files = [f for f in src.rglob("*") if f.is_file()]
    prefix = f"bench-in/{src.name}"
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda f: c.upload_file(str(f), BUCKET, f"{prefix}/{f.relative_to(src).as_posix()}"), files))
    print(f"{len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB, uploaded to s3://{BUCKET}/{prefix}/")
    times: dict[str, list[float]] = {"local": [], "s3": []}
    proxy, env = None, None
    if args.latency_ms:
        sys.path.insert(0, str(REPO / "tests"))
        from throttling_proxy import ThrottlingProxy

        proxy = ThrottlingProxy(int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]), every=0,
                                delay_s=args.latency_ms / 1000).__enter__()
        env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
        print(f"s3 runs: {args.latency_ms:g} ms added to every request")
    try:
        for i in range(args.rounds):
            times["local"].append(run(str(src), os.path.join(tmp, "out")))
            times["s3"].append(run(f"s3://{BUCKET}/{prefix}/", f"s3://{BUCKET}/bench-out", env))
            print(f"round {i + 1}: local {times['local'][-1]:.2f} s, s3->s3 {times['s3'][-1]:.2f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if proxy is not None:
            proxy.__exit__(None, None, None)
    local, s3 = statistics.median(times["local"]), statistics.median(times["s3"])
    print(f"median: local {local:.2f} s, s3->s3 {s3:.2f} s, ratio {s3 / local:.2f}x")


if __name__ == "__main__":
    main()
