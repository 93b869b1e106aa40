"""`python -m api [--host H] [--port P] [--db URL]`: serve the API and dashboard with uvicorn."""

from __future__ import annotations

import argparse

import db
import uvicorn

from .app import create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m api", description="Serve the gemmtune API and dashboard.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    parser.add_argument("--db", default=None, help=f"results database URL (default: $GEMMTUNE_DB, then {db.default_url()})")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    args = parser.parse_args(argv)
    try:
        app = create_app(args.db)
    except db.StorageError as exc:
        parser.exit(2, f"cannot open the results database {db.resolve_url(args.db)}: {exc}\n")
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
