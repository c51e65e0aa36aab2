"""HTTP endpoints: create an order (its receipt job is enqueued in the same transaction); and
pgqueue's dashboard at ``/pgqueue``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from orders_api.dashboard import dashboard
from orders_api.database import Session, engine
from orders_api.models import Order, Receipt
from orders_api.tasks import pgq, send_receipt


async def get_session() -> AsyncIterator[AsyncSession]:
    """One ``AsyncSession`` per request."""
    async with Session() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


class OrderIn(BaseModel):
    item: str = Field(min_length=1, max_length=200)
    quantity: int = Field(gt=0)
    email: str = Field(min_length=3, max_length=320)


class OrderCreated(BaseModel):
    id: int
    job_id: int


class OrderOut(BaseModel):
    id: int
    item: str
    quantity: int
    receipt_sent: bool


router = APIRouter()


@router.post("/orders", status_code=201)
async def create_order(order_in: OrderIn, session: SessionDep) -> OrderCreated:
    async with session.begin():
        order = Order(item=order_in.item, quantity=order_in.quantity, email=order_in.email)
        session.add(order)
        await session.flush()  # assigns order.id
        # In the session's transaction: the job exists exactly when the order does.
        job_id = await send_receipt.configure(session=session).aenqueue(order.id)
    return OrderCreated(id=order.id, job_id=job_id)


@router.get("/orders/{order_id}")
async def show_order(order_id: int, session: SessionDep) -> OrderOut:
    order = await session.get(Order, order_id)
    if order is None:
        raise HTTPException(status_code=404, detail="no such order")
    receipt = await session.scalar(select(Receipt.id).where(Receipt.order_id == order_id))
    return OrderOut(
        id=order.id, item=order.item, quantity=order.quantity, receipt_sent=receipt is not None
    )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    # Close pooled connections on this event loop before it ends.
    await pgq.adispose()
    await engine.dispose()


def create_app() -> FastAPI:
    app = FastAPI(title="orders", lifespan=lifespan)
    app.include_router(router)
    app.mount("/pgqueue", dashboard)
    return app


app = create_app()
