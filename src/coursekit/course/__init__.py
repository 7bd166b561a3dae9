"""The course system: author labs once, generate the student versions, grade submissions you cannot trust.

    coursekit course build | validate | grade SUBMISSIONS --out DIR | report DIR

Module map (in the order a submission meets them):
  config      where a course lives; nbgrader's settings come from the course's nbgrader_config.py
  authoring   solutions/<lab>/<lab>.py (jupytext) -> instructor notebook -> labs/<lab>/ (nbgrader), drift check
  program     which code of a notebook the re-check loads: definitions only
  wire        answers cross process boundaries as JSON, never as objects
  sandbox     the student's process: runs their functions on request, with timeouts and process-tree kills
  recheck     the lab's test cells (visible + hidden) run in the grader's process against the student's process
  testing     helpers for test cells: run a student function under torchrun, describe a figure as data
  autograde   nbgrader's own autograde of one submission in a private course folder
  grading     batches: one grader process per submission, in parallel, grades CSV, feedback HTML
  feedback    the feedback page (hidden-test source removed)
  report      score distribution per exercise as a figure
"""
