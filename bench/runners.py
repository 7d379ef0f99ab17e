"""Wall time of one `tokenmill prepare` job on each local Beam mode.

The input is ~3,000 documents: the real pages of ../shared/data/html_extraction (~660
gzipped HTML pages, many languages), the license texts of ../shared/data/near_duplicates
(~1,560 natural near-duplicates, so dedup has work) and the bundled sample's JSONL documents
copied under new ids (exact duplicates) up to --docs. Without ../shared/data, the bundled
sample alone is enlarged: its JSONL lines under new ids and its HTML pages under new names.

Every mode runs the same command line in a fresh process (so import and runner start-up
count, as they do for a user) with the default job config; only the Beam flags differ:

- default:            no runner flag (DirectRunner: Prism if its binary can be fetched or
                      is cached, else the in-process FnApiRunner)
- in_memory:          --direct_running_mode=in_memory (one worker whatever
                      --direct_num_workers says)
- multi_threading:    --direct_running_mode=multi_threading --direct_num_workers=2
- multi_processing:   --direct_running_mode=multi_processing --direct_num_workers=2
- portable_loopback:  --runner=PortableRunner --job_endpoint=embed --environment_type=LOOPBACK
                      --direct_num_workers=2
- flink, flink_external, spark, prism: the engines scripts/cluster.sh runs on this machine
                      (`scripts/cluster.sh install && scripts/cluster.sh up` first), with the
                      flags `scripts/cluster.sh flags ENGINE` prints
- hosts, hosts_spark: Flink or Spark on the cluster of namespace hosts (`scripts/cluster.sh up
                      hosts`, as root), whose workers see no local disk: the input is uploaded
                      to its S3 server first (not timed) and the job runs s3:// to s3://

Each mode also runs an empty job (one empty JSONL file): its fixed cost, the time before and
after the work (Beam's import, graph, job server and cluster submission, teardown).

    python bench/runners.py [--docs 3000] [--modes in_memory,flink,spark] [--repeat 1]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))
SAMPLE = REPO / "tokenmill" / "sample"

MODES: dict[str, list[str]] = {
    "default": [],
    "in_memory": ["--direct_running_mode=in_memory"],
    "multi_threading": ["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
    "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    "portable_loopback": ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK",
                          "--direct_num_workers=2"],
}
ENGINES = {"flink": "flink", "flink_external": "flink-external", "spark": "spark", "prism": "prism", "hosts": "hosts",
           "hosts_spark": "hosts-spark"}
STORE_MODES = {"hosts", "hosts_spark"}  # s3:// to s3:// on the hosts cluster's S3 server (scripts/cluster.sh env hosts)
BUCKET = "tokenmill"


def engine_flags(name: str) -> list[str]:
    out = subprocess.run([str(REPO / "scripts" / "cluster.sh"), "flags", ENGINES[name]], check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def copies_of_sample_jsonl(dst: Path, n: int) -> int:
    """Write n documents: the sample's JSONL records cycled, each copy with a new id and url."""
    records = []
    for line in (SAMPLE / "docs.jsonl").read_text(encoding="utf-8").splitlines():
        try:  # the sample holds deliberately broken lines too: only whole records are copied
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and isinstance(r.get("text"), str):
            records.append(r)
    with dst.open("w", encoding="utf-8") as fh:
        for i in range(n):
            r = dict(records[i % len(records)])
            copy = i // len(records)
            r["id"] = f"{r.get('id', 'doc')}-copy{copy}"
            if r.get("url"):
                r["url"] = f"{r['url']}?copy={copy}"
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return n


def build_input(tmp: Path, target: int) -> tuple[list[str], int, str]:
    """Returns (--input values, documents about to be read, description)."""
    inputs: list[str] = []
    html = DATA / "html_extraction"
    licenses = DATA / "near_duplicates" / "license_texts"
    if html.is_dir() and licenses.is_dir():
        globs = [str(html / "scrapinghub_aeb" / "html" / "*.html.gz"),
                 str(html / "trafilatura_eval" / "html" / "*.html.gz"),
                 str(html / "mozilla_readability" / "test-pages" / "*" / "source.html.gz")]
        n_real = sum(len(glob.glob(g)) for g in globs)
        inputs += globs
        # License texts (*.txt and *.LICENSE, the latter no reader takes by name) as one JSONL.
        texts = sorted(licenses.glob("spdx/*.txt")) + sorted(licenses.glob("scancode/*.LICENSE"))
        with (tmp / "licenses.jsonl").open("w", encoding="utf-8") as fh:
            for t in texts:
                text = t.read_text(encoding="utf-8", errors="replace")
                fh.write(json.dumps({"id": f"{t.parent.name}:{t.stem}", "text": text}, ensure_ascii=False) + "\n")
        inputs.append(str(tmp / "licenses.jsonl"))
        n_real += len(texts)
        n_jsonl = max(0, target - n_real)
        desc = f"{n_real:,} shared-data files (HTML pages + license texts) + {n_jsonl:,} sample JSONL copies"
    else:
        pages = sorted((SAMPLE / "pages").iterdir())
        n_pages_copies = max(1, target // 5 // len(pages))
        pdir = tmp / "pages"
        pdir.mkdir()
        for c in range(n_pages_copies):
            for p in pages:
                shutil.copyfile(p, pdir / f"c{c}-{p.name}")
        inputs.append(str(pdir))
        n_real = n_pages_copies * len(pages)
        n_jsonl = max(0, target - n_real)
        desc = f"{n_real:,} sample HTML page copies + {n_jsonl:,} sample JSONL copies (no ../shared/data)"
    if n_jsonl:
        copies_of_sample_jsonl(tmp / "docs.jsonl", n_jsonl)
        inputs.append(str(tmp / "docs.jsonl"))
    return inputs, n_real + n_jsonl, desc


def hosts_env() -> dict[str, str]:
    """The environment that reaches the hosts cluster's S3 server from here."""
    out = subprocess.run([str(REPO / "scripts" / "cluster.sh"), "env", "hosts"], check=True, capture_output=True,
                         text=True).stdout
    return {**os.environ, **dict(kv.split("=", 1) for line in out.splitlines() for kv in line.split()[1:])}


def upload(inputs: list[str], env: dict[str, str], prefix: str) -> list[str]:
    """Each input (a file, a folder or a glob) copied under s3://BUCKET/PREFIX/i/; their URLs."""
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    urls = []
    for i, spec in enumerate(inputs):
        p = Path(spec)
        files = sorted(p.rglob("*")) if p.is_dir() else [Path(f) for f in sorted(glob.glob(spec))]
        for k, f in enumerate(files):  # (a glob's files may share a name: numbered)
            if f.is_file():
                name = f.relative_to(p).as_posix() if p.is_dir() else f"{k:05d}-{f.name}"
                client.put_object(Bucket=BUCKET, Key=f"{prefix}/{i}/{name}", Body=f.read_bytes())
        urls.append(f"s3://{BUCKET}/{prefix}/{i}/")
    return urls


def store_report(out: str, env: dict[str, str]) -> dict:
    code = ("import json,sys; from tokenmill.store import Store; o=sys.argv[1]; st=Store(o); "
            "m=json.loads(st.read(o+'/manifest.json')); print(st.read(o+'/'+m['root']+'/report/report.json').decode())")
    return json.loads(subprocess.run([sys.executable, "-c", code, out], env=env, check=True, capture_output=True,
                                     text=True).stdout)


def run_mode(name: str, flags: list[str], inputs: list[str], out: Path | str,
             env: dict[str, str] | None = None) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "tokenmill.cli", "prepare", "--output", str(out)]
    for i in inputs:
        cmd += ["--input", i]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd + flags, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{name}: `tokenmill prepare` exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    if isinstance(out, str):
        return wall, store_report(out, env)
    report = json.loads((out / "report" / "report.json").read_text())
    return wall, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=3000, help="about this many input documents (default 3000)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated subset of {','.join([*MODES, *ENGINES])}")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode; the best wall time is shown")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES and m not in ENGINES]
    if unknown:
        ap.error(f"unknown mode(s): {', '.join(unknown)}")
    for m in modes:
        if m in ENGINES:
            MODES[m] = engine_flags(m)

    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-runners-") as d:
        tmp = Path(d)
        inputs, n, desc = build_input(tmp, args.docs)
        (tmp / "empty.jsonl").write_text("")
        print(f"input: ~{n:,} documents: {desc}; {os.cpu_count()} CPU(s)")
        rows = []
        for name in modes:
            env, ins, empty, outs = None, inputs, [str(tmp / "empty.jsonl")], [tmp / f"out-{name}-{r}"
                                                                               for r in range(args.repeat)]
            if name in STORE_MODES:
                env = hosts_env()
                stamp = time.strftime("%Y%m%dT%H%M%S")
                ins, empty = upload(inputs, env, f"bench/{stamp}/in"), upload(empty, env, f"bench/{stamp}/empty")
                outs = [f"s3://{BUCKET}/bench/{stamp}/out-{r}" for r in range(args.repeat)]
            fixed, _ = run_mode(name, MODES[name], empty, tmp / f"empty-{name}" if env is None else
                                f"s3://{BUCKET}/bench/{stamp}/empty-out", env)
            walls, report = [], {}
            for out in outs:
                wall, report = run_mode(name, MODES[name], ins, out, env)
                walls.append(wall)
                if env is None:
                    shutil.rmtree(out, ignore_errors=True)
            docs = report["documents"]
            rows.append((name, min(walls), fixed, docs["read"], docs["kept"], report.get("tokens_kept", 0)))
            print(f"  {name}: {min(walls):.1f} s (empty job {fixed:.1f} s)", flush=True)

    print()
    base = rows[0][1]
    print(f"{'mode':<19} {'wall s':>8} {'x ' + rows[0][0]:>14} {'empty s':>8} {'docs/s':>8} {'read':>7} {'kept':>7} "
          f"{'tokens kept':>12}  flags")
    for name, wall, fixed, read, kept, tokens in rows:
        print(f"{name:<19} {wall:>8.1f} {wall / base:>14.2f} {fixed:>8.1f} {read / wall:>8.1f} {read:>7,} {kept:>7,} "
              f"{tokens:>12,}  {' '.join(MODES[name]) or '(none)'}")
    kept = {r[4] for r in rows}
    if len(kept) > 1:
        print("WARNING: the modes kept different numbers of documents")
    fastest = min(rows, key=lambda r: r[1])
    print(f"fastest: {fastest[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
