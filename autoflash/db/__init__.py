"""The tuning database: SQLAlchemy models (models.py) and the only code that speaks SQL (store.py)."""
