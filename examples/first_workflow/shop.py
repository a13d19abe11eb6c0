"""A first workflow: look an order up, charge it once, pack it, mail the receipt."""

import time

import perdure

app = perdure.App()  # its store: .perdure/perdure.db here (or PERDURE_DB)


# Stand-ins for your payment provider and mailer: they print what they do.
def charge_card(order: str, amount: int) -> str:
    print(f"charging {order}: {amount} EUR", flush=True)
    return f"ch_{order}"


def send_mail(order: str, text: str) -> None:
    print(f"mailing {order}: {text}", flush=True)


@app.step(effect="read")  # changes nothing outside: run again after a crash
def load_order(order: str) -> int:
    print(f"loading {order}", flush=True)
    return 42


@app.step(effect="once")  # never run twice: a crash inside it parks the run for a person
def charge(order: str, amount: int) -> str:
    return charge_card(order, amount)


@app.step(effect="idempotent")  # same outcome if repeated: run again after a crash
def pack(order: str) -> str:
    print(f"packing {order} (5 s)", flush=True)
    time.sleep(5)
    return f"parcel-{order}"


@app.step()  # no effect declared: "once"
def send_receipt(order: str, charge_id: str, parcel: str) -> None:
    send_mail(order, f"charged {charge_id}, shipped {parcel}")


@app.workflow()
def checkout(order: str) -> str:
    amount = load_order(order)
    charge_id = charge(order, amount)
    parcel = pack(order)
    send_receipt(order, charge_id, parcel)
    return f"{order}: {charge_id}, {parcel}"
