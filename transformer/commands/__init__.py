"""The command-line programs: one module per command, each with `main(argv) -> exit status`.

    transformer-train, transformer-translate, … (console entry points, pyproject.toml)
    python scripts/train.py …                   (scripts/*.py call the same `main`)
    python -m transformer.commands.train …      (this checkout, installed or not)

A command module imports no TensorFlow when it is imported: `main` parses the flags, runs
`cli.start()` (logging, TensorFlow/tensorflow-text version check) and only then imports the
parts of the package that load TensorFlow (tests/commands/test_commands.py checks both). To start one
of this checkout's commands in a child process use `cli.command_line(name, …)` with
`env=cli.subprocess_env()`.
"""

