"""The parts of flopwatch that do I/O: Kafka, ClickHouse, the Faust app, the CLI."""
