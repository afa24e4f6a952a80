"""The Krill database: an index of chain + store, and the roles' own state (SQLite or PostgreSQL).

Public API:
    open_database(url | DatabaseConfig | KrillConfig, create=True) -> Database   (session.py)
    Database.session() / .write() context managers; .sessions / .write_sessions sessionmakers;
        .create_all(), .reset_index(), .close()
    table_rows(session, tables=INDEX_TABLES) -> {table: [row tuples]}
    Indexer(chain, database, store=None, *, start_block, confirmations, batch_blocks, ...)  (indexer.py)
        .sync() -> SyncReport, .rebuild(), .follow(poll_interval_s, stop), .status() -> IndexStatus
    Models (models.py): index tables Run, Version, Shard, Participant, Commit, Header, Verdict, Slash,
        Reward, ChainEventRow, IndexMeta; role-state tables Contribution, Metric, Eval, RoleCursor,
        SchemaVersion; enums FetchStatus, ContributionStatus, RejectionCode, RewardKind, ParticipantRole.
    Value spellings: hex32, address, tx_hash (types.py).
"""
