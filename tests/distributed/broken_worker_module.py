"""A module whose import fails, as a worker target would on a broken install."""

raise ImportError("this module cannot be imported (on purpose)")
