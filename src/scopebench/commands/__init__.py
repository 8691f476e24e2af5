"""Subcommands of ``scopebench`` (registered in :data:`scopebench.cli.COMMANDS`)."""
