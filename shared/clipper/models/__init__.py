"""Model artifacts: validation of uploaded ONNX files and the event-triggered updater that registers them."""
