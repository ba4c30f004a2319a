"""What people read: the CLI's tables, `show`'s report and the dashboard server.

These modules read the storage and never write it; the views the search pushes into the
dashboard are built here (`dashboard_views`) and written by `budgettune.study.publish`.
"""
