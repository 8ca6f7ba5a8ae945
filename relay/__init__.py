"""The ``relay`` command: the composition root that wires the core (``broker``), its fronts and the
storage adapters (``adapters``) into the programs people run. Nothing else imports both sides."""
