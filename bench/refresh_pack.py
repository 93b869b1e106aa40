"""Re-measure a pack's configs under the installed kernel sources, on this host's GPU model.

    python bench/refresh_pack.py --db URL [--pack FILE] [--gpu 0] [--out FILE]

A pack records each best config with the source hash it was measured with; once a family's
source changes, `gemmtune.matmul` skips those entries ("other version"). This stores the pack in
the results database (when the database holds none of its runs yet), then, for every entry of
this GPU's model tuned with another source version, runs the tuner's own command for that
family and shape with one measured trial (`python -m tuner --trials 1`): its warm start puts
the same shape's stored best, the pack's config, first. Run it on one host per GPU model
against the same database, then `--out` writes the pack of everything installed that it holds,
with the entries of GPU models no host re-measured kept as they were (awaiting one).
A refresh cut short resumes: entries the database already holds re-measured are not run again.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
import kernels  # noqa: E402
from gemmtune.pack import build_pack, import_pack, read_pack, write_pack  # noqa: E402

PACK = ROOT / "examples" / "pack-h100-h200.json"


def gpu_model(index: int) -> str:
    done = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def pack_imported(database: db.Database) -> bool:
    """Whether the database holds any pack's runs (sampler "pack"), among all its runs: the
    H200 half of a refresh reuses the database the H100 half imported the pack into."""
    offset = 0
    while runs := database.list_runs(offset=offset, limit=100):
        if any(r.sampler == "pack" for r in runs):
            return True
        offset += len(runs)
    return False


def stored(url: str, model: str, entry: dict, family: kernels.Family):
    """The database's best result for the entry's shape under the installed source of its
    family, or None."""
    with db.open_database(url) as database:
        return database.best(model, entry["m"], entry["n"], entry["k"], family=family.name, nearest=False,
                             source_hash=family.source_hash)


def own(found, entry: dict, family: kernels.Family) -> bool:
    """Whether a stored result is the entry's own config (one stored before a parameter was
    added counts as it ran)."""
    return found is not None and family.completed(found.params) == family.completed(entry["config"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, metavar="URL", help="results database the re-measured runs go to")
    ap.add_argument("--pack", type=Path, default=PACK, metavar="FILE", help=f"pack to refresh (default {PACK.name})")
    ap.add_argument("--gpu", type=int, default=0, metavar="INDEX")
    ap.add_argument("--out", type=Path, default=None, metavar="FILE", help="write the refreshed pack here")
    args = ap.parse_args(argv)
    pack = read_pack(args.pack)
    with db.open_database(args.db) as database:
        if not pack_imported(database):
            print(f"stored {import_pack(pack, database, source=args.pack.name)} entries of {args.pack}")
    model = gpu_model(args.gpu)
    todo = [e for e in pack["entries"]
            if e["gpu"] == model and kernels.get_family(e["family"]).source_hash != e["source_hash"]]
    print(f"{model}: {len(todo)} entries to re-measure", flush=True)
    for e in todo:
        shape = f"{e['m']}x{e['n']}x{e['k']}"
        family = kernels.get_family(e["family"])
        found = stored(args.db, model, e, family)
        if not own(found, e, family):  # else a refresh cut short got this far
            command = [sys.executable, "-m", "tuner", "--gpu", str(args.gpu), "--db", args.db, "--kernel",
                       e["family"], "--shape", shape, "--trials", "1"]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            if done.returncode:
                sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
                return done.returncode
            found = stored(args.db, model, e, family)
        same = own(found, e, family)
        print(f"{shape:>15} {e['family']:9} {'same config' if same else 'OTHER CONFIG'}  "
              f"{e['gflops']:9.0f} → {found.gflops if found else 0:9.0f} GFLOP/s", flush=True)
        if not same:
            return 1  # the pack would name a config that was not measured as the pack's
    if args.out:
        with db.open_database(args.db) as database:
            write_pack(with_others_kept(pack, build_pack(database), model), args.out)
        print(f"wrote {args.out}")
    return 0


def entry_key(e: dict) -> tuple:
    """What a pack holds one entry of (build_pack's key), in its order."""
    return e["gpu"], e["m"], e["n"], e["k"], e.get("layout", "nn"), e.get("batch", 1), e["precision"]


def with_others_kept(old: dict, new: dict, model: str) -> dict:
    """``new`` (the database's pack of installed versions) plus the entries of ``old`` of the
    GPU models not refreshed here that ``new`` lacks, with their boards' records: entries of
    another source version awaiting a host of their model stay in the pack, as they were,
    instead of leaving it when only one model's host is lent."""
    have = {entry_key(e) for e in new["entries"]}
    kept = [e for e in old["entries"] if e["gpu"] != model and entry_key(e) not in have]
    gpus = {**{e["gpu_uuid"]: old["gpus"][e["gpu_uuid"]] for e in kept}, **new["gpus"]}
    return {**new, "entries": sorted([*new["entries"], *kept], key=entry_key),
            "gpus": dict(sorted(gpus.items(), key=lambda kv: (kv[1]["name"], kv[0])))}


if __name__ == "__main__":
    sys.exit(main())
