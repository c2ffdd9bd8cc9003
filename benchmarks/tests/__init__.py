"""The benchmark's tests (collected by pytest through ``testpaths``)."""
