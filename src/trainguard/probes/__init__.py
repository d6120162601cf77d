"""Probes measure a step on the device; nothing here reads values back to the host.

`packing.DevicePack` gathers what the probes produce and crosses to the host once per step.
"""
