"""``python -m relay``: the ``relay`` command."""

from relay.entry import main

if __name__ == "__main__":
    raise SystemExit(main())
