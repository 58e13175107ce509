"""Forty JSON schemas as users write them: numbers, strings and arrays with no bounds of their
own (no maxLength, no minimum/maximum, no maxItems on scalar arrays), nested objects and arrays.
The engine's own bounds (mlxr/engine/structured/json_bounds.py) must make every one end."""
from __future__ import annotations

NUM, INT, STR, BOOL = {"type": "number"}, {"type": "integer"}, {"type": "string"}, {"type": "boolean"}


def obj(**props) -> dict:
    return {"type": "object", "properties": props, "required": list(props)}


def arr(items: dict, **extra) -> dict:
    return {"type": "array", "items": items, **extra}


OPEN_SCHEMAS: dict[str, dict] = {
    "score": obj(score=NUM),
    "point": obj(x=NUM, y=NUM),
    "point3": obj(x=NUM, y=NUM, z=NUM),
    "count": obj(count=INT),
    "price": obj(item=STR, price=NUM),
    "person": obj(name=STR, age=INT),
    "person_email": obj(name=STR, email=STR, verified=BOOL),
    "title": obj(title=STR),
    "summary": obj(title=STR, summary=STR),
    "rating": obj(product=STR, rating=NUM, comment=STR),
    "temperature": obj(city=STR, celsius=NUM, fahrenheit=NUM),
    "measurement": obj(value=NUM, unit=STR),
    "coordinates": obj(lat=NUM, lon=NUM),
    "range": obj(low=NUM, high=NUM),
    "stats": obj(mean=NUM, median=NUM, stdev=NUM, n=INT),
    "bbox": obj(x0=NUM, y0=NUM, x1=NUM, y1=NUM),
    "tags": obj(tags=arr(STR, maxItems=5)),
    "numbers": obj(values=arr(NUM, maxItems=6)),
    "matrix": obj(rows=arr(arr(NUM, maxItems=3), maxItems=3)),
    "nested_point": obj(origin=obj(x=NUM, y=NUM), size=obj(w=NUM, h=NUM)),
    "address": obj(street=STR, city=STR, zip=STR, country=STR),
    "contact": obj(person=obj(name=STR, phone=STR), address=obj(city=STR, country=STR)),
    "order": obj(id=INT, items=arr(obj(sku=STR, qty=INT, price=NUM), maxItems=3), total=NUM),
    "event": obj(name=STR, year=INT, month=INT, day=INT),
    "book": obj(title=STR, author=STR, pages=INT, rating=NUM),
    "movie": obj(title=STR, year=INT, genres=arr(STR, maxItems=3), score=NUM),
    "weather": obj(city=STR, days=arr(obj(day=STR, high=NUM, low=NUM), maxItems=3)),
    "vector": obj(embedding=arr(NUM, minItems=3, maxItems=3)),
    "polygon": obj(points=arr(obj(x=NUM, y=NUM), maxItems=4)),
    "answer": obj(answer=STR, confidence=NUM),
    "classify": obj(label=STR, probability=NUM),
    "translation": obj(source=STR, target=STR, language=STR),
    "recipe": obj(name=STR, servings=INT, ingredients=arr(obj(name=STR, grams=NUM), maxItems=4)),
    "invoice": obj(number=STR, lines=arr(obj(desc=STR, amount=NUM), maxItems=3), tax=NUM, paid=BOOL),
    "timeseries": obj(series=arr(obj(t=INT, v=NUM), maxItems=4)),
    "optional_fields": {"type": "object", "properties": {"a": NUM, "b": STR, "c": INT}, "required": ["a"]},
    "any_of_number_or_string": obj(v={"anyOf": [NUM, STR]}),
    "nullable_number": obj(v={"type": ["number", "null"]}),
    "deep": obj(a=obj(b=obj(c=obj(d=NUM, e=STR)))),
    "grid": obj(cells=arr(arr(INT, maxItems=3), maxItems=3), label=STR),
    "key_values": obj(pairs=arr(obj(key=STR, value=NUM), maxItems=4)),
    "science": obj(constant=STR, value=NUM, exponent=INT),
}
