"""`python -m gemmtune export-pack [--db URL] [-o pack.json] [--gpu NAME …] [--precision fp32|ffma]`
writes the best configs per (GPU model, shape, arithmetic class) to a small JSON file.
`python -m gemmtune show-pack PACK` lists a pack's entries and whether this installation runs them.
`python -m gemmtune import-pack PACK [--db URL]` stores a pack's entries in a results database."""

from __future__ import annotations

import argparse
import sys

import db
import kernels

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
    args = ap.parse_args(argv)

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
            print(f"  {e['gpu']:<28} {e['m']}x{e['n']}x{e['k']:<8} {e['precision']:<8} {e['family']:<12} "
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


if __name__ == "__main__":
    sys.exit(main())
