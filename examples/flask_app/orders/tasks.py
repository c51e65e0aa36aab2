"""Background jobs. Declared on the extension at import time, before any app exists."""

from __future__ import annotations

import logging

from orders.extensions import db, pgq
from orders.models import Order, Receipt

log = logging.getLogger(__name__)


@pgq.task(queue="mail", max_attempts=5)
def send_receipt(order_id: int) -> dict[str, int]:
    """ "Send" the receipt for an order and record that it was sent.

    Runs in an app context with a fresh ``db.session``: pgqueue commits it when this returns
    and rolls it back if this raises (the job is then retried with backoff).
    """
    order = db.session.get(Order, order_id)
    if order is None:
        raise LookupError(f"order {order_id} does not exist")
    body = f"Thanks! {order.quantity} x {order.item}, order #{order.id}."
    log.info("sending receipt to %s: %s", order.email, body)  # a real app calls its mailer here
    db.session.add(Receipt(order_id=order.id, body=body))
    return {"order_id": order.id}
