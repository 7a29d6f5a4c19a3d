from django.db import models


class Order(models.Model):
    total = models.IntegerField(default=0)
    note = models.CharField(max_length=200, default="")

    class Meta:
        app_label = "djshop"
