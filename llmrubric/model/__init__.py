"""The calibrator and the models it is compared with."""
