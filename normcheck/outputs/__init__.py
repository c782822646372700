"""What a run shows: table rows, replay lines, the JSON document, JUnit XML, plots, the progress bar."""
