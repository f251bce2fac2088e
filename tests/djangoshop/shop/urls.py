from django.urls import path

from . import views

urlpatterns = [path(f"{name}/<int:pk>", getattr(views, name)) for name in views.VIEWS]
