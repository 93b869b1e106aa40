"""`python -m gemmtune export-pack [--db URL] [-o pack.json] [--gpu NAME …] [--precision fp32|ffma]`
writes the best configs per (GPU model, shape, arithmetic class) to a small JSON file.
`python -m gemmtune show-pack PACK` lists a pack's entries and whether this installation runs them.
`python -m gemmtune import-pack PACK [--db URL]` stores a pack's entries in a results database.
`python -m gemmtune profile SCRIPT [ARGS ...] [-o workload.json]` runs a PyTorch script and records
the FP32 GEMMs it runs into a workload file for `python -m tuner --workload FILE`."""

from __future__ import annotations

import argparse
import sys

import db
import kernels
from kernels.layout import problem_label

from .pack import PackError, build_pack, import_pack, read_pack, write_pack
from .precision import PRECISION_NAMES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gemmtune", description="gemmtune user-side tools.")
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export-pack", help="write the best tuned configs to a JSON pack")
    ex.add_argument("--db", default=None, help=f"results database URL (default: $GEMMTUNE_DB, then {db.default_url()})")
    ex.add_argument("-o", "--output", default="gemmtune-pack.json", help="pack file to write (default: %(default)s)")
    ex.add_argument("--gpu", action="append", default=None, help="only this GPU model (name or UUID; repeatable)")
    ex.add_argument("--precision", choices=PRECISION_NAMES, default="fp32",
                    help="fp32: entries of both arithmetic classes; ffma: FFMA kernels only (default: %(default)s)")
    ex.add_argument("--all-versions", action="store_true",
                    help="also keep results of family versions other than the installed ones")
    show = sub.add_parser("show-pack", help="list a pack's entries and whether this installation can run them")
    show.add_argument("pack")
    imp = sub.add_parser("import-pack", help="store a pack's entries in a results database (one run each)")
    imp.add_argument("pack")
    imp.add_argument("--db", default=None, help=f"results database URL (default: $GEMMTUNE_DB, then {db.default_url()})")
    prof = sub.add_parser("profile", help="run a PyTorch script and record the FP32 GEMMs it runs (a workload file)")
    prof.add_argument("-o", "--output", default="workload.json", help="workload file to write (default: %(default)s)")
    prof.add_argument("--enabled", action="store_true",
                      help="run with the switch on (gemmtune.enable()), recording what runs then")
    prof.add_argument("script", help="the Python script to run (as `python SCRIPT ARGS`)")
    prof.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = ap.parse_args(argv)

    if args.command == "profile":
        return _profile(args, ap)

    if args.command == "import-pack":
        try:
            pack = read_pack(args.pack)
            with db.open_database(args.db) as database:
                stored = import_pack(pack, database, source=args.pack)
        except (PackError, db.StorageError) as exc:
            ap.exit(2, f"{exc}\n")
        print(f"stored {stored} entries of {args.pack} in {db.resolve_url(args.db)}")
        return 0

    if args.command == "show-pack":
        try:
            pack = read_pack(args.pack)
        except PackError as exc:
            ap.exit(2, f"{exc}\n")
        print(f"{args.pack}: {len(pack['entries'])} entries, created {pack.get('created_at')} from {pack.get('database')}")
        for e in pack["entries"]:
            fam = kernels.FAMILIES.get(e["family"])
            usable = "ok" if fam is not None and fam.source_hash == e["source_hash"] else "SKIPPED (other version)"
            frac = e.get("fraction_of_cublas")
            label = problem_label(e["m"], e["n"], e["k"], e.get("layout", "nn"), e.get("batch", 1))
            print(f"  {e['gpu']:<28} {label:<20} {e['precision']:<8} {e['family']:<12} "
                  f"{e['gflops']:>9.0f} GFLOP/s {'' if frac is None else f'{frac:5.2f}x cuBLAS'}  {usable}")
        return 0

    from sqlalchemy.engine import make_url

    url = make_url(db.resolve_url(args.db))
    if url.get_backend_name() == "sqlite" and url.database and not __import__("os").path.exists(url.database):
        ap.exit(2, f"the results database {url.database} does not exist (nothing to export)\n")
    try:
        database = db.open_database(args.db)
    except db.StorageError as exc:
        ap.exit(2, f"cannot open the results database {db.resolve_url(args.db)}: {exc}\n")
    with database:
        pack = build_pack(database, gpus=args.gpu, precision=args.precision, installed_only=not args.all_versions)
    path = write_pack(pack, args.output)
    gpus = sorted({e["gpu"] for e in pack["entries"]})
    print(f"wrote {path}: {len(pack['entries'])} entries for {len(gpus)} GPU model(s) {', '.join(gpus)}")
    return 0


def _profile(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    import contextlib
    import os
    import runpy

    from .switch import enabled
    from .workload import record_workload

    if not os.path.isfile(args.script):
        ap.exit(2, f"no such script: {args.script}\n")
    saved = sys.argv
    sys.argv = [args.script, *args.script_args]
    try:
        with record_workload(label=os.path.basename(args.script)) as recorder, \
                (enabled() if args.enabled else contextlib.nullcontext()):
            runpy.run_path(args.script, run_name="__main__")
    finally:
        sys.argv = saved
    from db.workloads import write_workload

    workload = recorder.workload(os.path.basename(args.script))
    path = write_workload(workload, args.output)
    calls = sum(p["count"] for p in workload["problems"])
    print(f"wrote {path}: {len(workload['problems'])} GEMM problems, {calls} calls, {workload['gemm_ms']:.1f} ms of "
          f"GEMM time on {workload['gpu']}" + (f"; skipped {workload['skipped']}" if workload["skipped"] else ""))
    for p in workload["problems"][:10]:
        print(f"  {problem_label(p['m'], p['n'], p['k'], p['layout'], p['batch']):<24} {p['count']:>6} calls "
              f"{p['share']:6.1%} of GEMM time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
