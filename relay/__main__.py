"""``python -m relay``: the ``relay`` command."""

from relay.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
