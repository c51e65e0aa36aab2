"""pgqueue for Flask: an extension in the ``init_app`` style, ``flask pgqueue`` commands, and a
dashboard (:func:`pgqueue.contrib.flask.dashboard.init_dashboard`). ``get_state(app)`` is the
one way to an app's pgqueue state (its core queue and tasks) from outside the extension.

::

    db = SQLAlchemy(model_class=Base)
    pgq = PgQueue(db=db)

    @pgq.task(queue="mail")
    def send_receipt(order_id: int) -> None:
        db.session.add(Receipt(order_id=order_id))   # committed by pgqueue when this returns

    def create_app():
        app = Flask(__name__)
        db.init_app(app)
        pgq.init_app(app)
        return app
"""

from pgqueue.contrib.flask._extension import AppState, PgQueue, get_state

__all__ = ["AppState", "PgQueue", "get_state"]
