from django.db import models


class Order(models.Model):
    """The application's own row, written in the same transaction as its intent."""

    id = models.IntegerField(primary_key=True)
    total_cents = models.IntegerField()
