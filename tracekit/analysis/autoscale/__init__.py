"""Autoscale: replay a scaling rule over the traced time line and rank the signals."""
