"""`python -m api [--host H] [--port P] [--db URL] [--workers N]`: serve the API and dashboard with uvicorn."""

from __future__ import annotations

import argparse
import os

import db
import uvicorn

from .app import create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m api", description="Serve the gemmtune API and dashboard.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    parser.add_argument("--db", default=None, help=f"results database URL (default: $GEMMTUNE_DB, then {db.default_url()})")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--workers", type=int, default=1,
                        help="uvicorn worker processes, each with its own /api/best snapshot (default: %(default)s)")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 64:
        parser.error(f"--workers must be 1..64, got {args.workers}")
    try:
        app = create_app(args.db)
    except db.StorageError as exc:
        parser.exit(2, f"cannot open the results database {db.resolve_url(args.db)}: {exc}\n")
    if args.workers == 1:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
        return
    # Several processes: each builds its own app from the environment (the schema is already
    # prepared above, so they do not race to migrate it).
    app.state.database.close()
    os.environ[db.urls.ENV_VAR] = db.resolve_url(args.db)
    uvicorn.run("api.app:app_from_env", factory=True, host=args.host, port=args.port, log_level=args.log_level,
                workers=args.workers)


if __name__ == "__main__":
    main()
