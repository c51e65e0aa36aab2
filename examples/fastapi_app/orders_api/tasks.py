"""The job queue and the background jobs. The worker loads ``orders_api.tasks:pgq``."""

from __future__ import annotations

import logging

from sqlalchemy import select

from orders_api.database import Session, database_url
from orders_api.models import Order, Receipt
from pgqueue import PgQueue

log = logging.getLogger(__name__)

# The same database as the app: enqueues join the app's AsyncSession transactions.
pgq = PgQueue(database_url())


@pgq.task(queue="mail", max_attempts=5)
async def send_receipt(order_id: int) -> dict[str, int]:
    """ "Send" the receipt for an order and record that it was sent.

    An ``async def`` handler: the worker runs it on its asyncio loop, where it uses the app's
    ``AsyncSession`` as an endpoint does. A job is delivered at least once, so it checks first
    whether an earlier attempt already sent the receipt.
    """
    async with Session() as session, session.begin():
        order = await session.get(Order, order_id)
        if order is None:
            raise LookupError(f"order {order_id} does not exist")
        sent = await session.scalar(select(Receipt.id).where(Receipt.order_id == order_id))
        if sent is None:
            body = f"Thanks! {order.quantity} x {order.item}, order #{order.id}."
            log.info("sending receipt to %s: %s", order.email, body)  # a real app: its mailer
            session.add(Receipt(order_id=order.id, body=body))
    return {"order_id": order_id}
