"""Pure stream logic of flopwatch: no Kafka, ClickHouse, NVML, environment or wall clock."""
