"""Browser tests of the /ui page (Playwright driving the system Chromium)."""
