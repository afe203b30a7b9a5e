"""`torchport keys create NAME` / `keys revoke ID` / `keys list`: API keys in the database.

Once any key exists, every API call needs `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport keys`."""
    parser.add_argument("--data-dir", type=Path, help="data directory (TORCHPORT_DATA_DIR)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = sub.add_parser("create", help="create a key; it is printed once")
    create.add_argument("name")
    revoke = sub.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("id")
    sub.add_parser("list", help="list keys (never their secrets)")


def run(args: argparse.Namespace) -> int:
    """Create, revoke or list keys; returns the exit code."""
    from persistence.database import make_engine, make_session_factory, migrate, transaction
    from service.auth import create_key, list_keys, revoke_key
    from service.errors import NotFound
    from service.settings import ServiceSettings

    settings = ServiceSettings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    url = settings.resolved_database_url
    migrate(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    try:
        with transaction(sessions) as session:
            if args.action == "create":
                key = create_key(session, args.name)
                out = {
                    "id": key.id,
                    "name": key.name,
                    "key": key.secret,
                    "webhook_secret": key.webhook_secret,
                }
                if args.json:
                    print(json.dumps(out))
                else:
                    print(
                        f"id:             {key.id}\nname:           {key.name}\n"
                        f"key:            {key.secret}\nwebhook secret: {key.webhook_secret}\n"
                        "The key is shown only now; store it safely."
                    )
            elif args.action == "revoke":
                try:
                    revoke_key(session, args.id)
                except NotFound:
                    print(
                        json.dumps({"code": "not_found", "id": args.id})
                        if args.json
                        else f"no key {args.id}"
                    )
                    return 1
                print(json.dumps({"revoked": args.id}) if args.json else f"revoked {args.id}")
            else:
                rows = [
                    {
                        "id": k.id,
                        "name": k.name,
                        "created_at": k.created_at.isoformat(),
                        "revoked": k.revoked_at is not None,
                    }
                    for k in list_keys(session)
                ]
                if args.json:
                    print(json.dumps(rows))
                else:
                    for row in rows:
                        print(
                            f"{row['id']}  {row['name']}  {row['created_at']}"
                            f"{'  revoked' if row['revoked'] else ''}"
                        )
    finally:
        engine.dispose()
    return 0
