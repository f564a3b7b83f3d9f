"""The REST API's pydantic shapes, one module per resource; import the module that holds a name."""
