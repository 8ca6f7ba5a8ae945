"""``python -m broker``: the ``relay`` command."""

from broker.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
