"""``python -m dsec.cli``: the same as the ``dsec`` command."""

from dsec.cli.main import app

app(prog_name="dsec")
