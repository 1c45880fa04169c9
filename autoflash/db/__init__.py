"""The tuning database. Standard library only: urls.py (where databases are), base.py (what both sides share: the
plain records, StoreError, the best-trial rule) and records.py (the read path dispatch uses, sqlite3). With the
`tune` extra: models.py (SQLAlchemy tables) and store.py (writing, merging, tuning's queries, PostgreSQL)."""
