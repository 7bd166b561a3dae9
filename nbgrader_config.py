# nbgrader settings of the course, for nbgrader's own commands, JupyterLab's formgrader and `coursekit course`.
# (`coursekit course` reads this file too, then points root and database at private temporary folders.)
import os

c = get_config()  # noqa: F821 (injected by traitlets when it loads this file)
_root = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "coursekit"
c.CourseDirectory.root = _root
# Instructors author solutions/<lab>/<lab>.py (jupytext percent); `coursekit course build` writes the notebook
# solutions/<lab>/<lab>.ipynb next to it (not committed) and generates the student version into labs/<lab>/.
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
# nbgrader's working folders and gradebook stay out of the repository (/course/ is git-ignored).
c.CourseDirectory.submitted_directory = "course/submitted"
c.CourseDirectory.autograded_directory = "course/autograded"
c.CourseDirectory.feedback_directory = "course/feedback"
c.CourseDirectory.solution_directory = "course/solution"
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(_root, "course", "gradebook.db")
os.makedirs(os.path.join(_root, "course"), exist_ok=True)  # sqlite does not create the folder of its file
# The exchange behind JupyterLab's *Assignment List* and formgrader's release/collect (nbgrader's default,
# /usr/local/share/nbgrader/exchange, does not exist on a fresh machine). `coursekit lab` makes it writable to all.
c.Exchange.root = os.environ.get("COURSEKIT_EXCHANGE") or os.path.join(_root, "course", "exchange")
os.makedirs(c.Exchange.root, exist_ok=True)
# Never copy a lab's source file (with its solutions and hidden tests) into the release or into a student's
# autograded folder: nbgrader copies every non-notebook file of a source folder unless it is ignored here.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.py", ".gitignore"]

# Graded cells launch real multi-process jobs (a torchrun start alone costs 6-8 s of imports on 2 CPU cores):
# nbgrader's default of 30 s per cell is too short. A cell that runs longer is interrupted (SIGINT);
# coursekit.launch stops every process of its job when interrupted.
c.Execute.timeout = 180
c.Execute.interrupt_on_timeout = True
# Put deleted test cells back (a deleted test must not mean "no test").
c.OverwriteCells.add_missing_cells = True
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
