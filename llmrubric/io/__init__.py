"""Tables, rubrics, predictions and the checks that guard them."""
