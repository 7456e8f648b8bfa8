"""The contracts of flopwatch: sensor catalog, records, codec, ClickHouse DDL.

Pure data and pure functions; nothing here does I/O.
"""
