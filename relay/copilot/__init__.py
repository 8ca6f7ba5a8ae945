"""The GitHub Copilot CLI (``@github/copilot``) on the host tier: ``relay setup copilot`` (``setup``);
it starts with ``relay run copilot`` (``relay.launch``)."""
