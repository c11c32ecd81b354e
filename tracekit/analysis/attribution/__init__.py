"""Attribution: each request's critical path split by stage, and one trace explained."""
