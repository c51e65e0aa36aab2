"""HTTP endpoints: create an order (its receipt job is enqueued in the same transaction)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, request

from orders.extensions import db
from orders.models import Order, Receipt
from orders.tasks import send_receipt

bp = Blueprint("orders", __name__)


@bp.post("/orders")
def create_order() -> tuple[dict[str, Any], int]:
    data = request.get_json(silent=True) or {}
    try:
        order = Order(
            item=str(data["item"]), quantity=int(data["quantity"]), email=str(data["email"])
        )
    except (KeyError, TypeError, ValueError):
        abort(400, description="need item, quantity and email")
    db.session.add(order)
    db.session.flush()  # assigns order.id
    # Joins db.session: the job exists exactly when the order does.
    job_id = send_receipt.enqueue(order.id)
    db.session.commit()
    return {"id": order.id, "job_id": job_id}, 201


@bp.get("/orders/<int:order_id>")
def show_order(order_id: int) -> dict[str, Any]:
    order = db.get_or_404(Order, order_id)
    receipt = db.session.scalar(db.select(Receipt).filter_by(order_id=order.id))
    return {
        "id": order.id,
        "item": order.item,
        "quantity": order.quantity,
        "receipt_sent": receipt is not None,
    }
