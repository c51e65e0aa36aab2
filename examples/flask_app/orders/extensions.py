"""The app's extensions, created unbound at import time and bound in ``create_app``."""

from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase

from pgqueue.contrib.flask import PgQueue


class Base(DeclarativeBase):
    """The app's own declarative base (pgqueue's tables live in pgqueue's own MetaData)."""


db = SQLAlchemy(model_class=Base)
migrate = Migrate()
# With db=, pgqueue reuses db.engine, enqueues join db.session, and jobs get a fresh db.session.
pgq = PgQueue(db=db)
