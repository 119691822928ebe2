"""SQL Server error classification, with the exception objects pymssql and pyodbc really raise.

Each exception is built from the driver's own class in the shape the driver builds it: pymssql
wraps ``(number, message bytes)`` (``_pymssql.pyx``: ``raise OperationalError, e.args[0]``),
pyodbc passes ``(sqlstate, "[sqlstate] text (native number) (SQLFunction)")`` (``errors.cpp``).
Message texts and numbers are SQL Server's and FreeTDS's documented ones. What only a real server
can show -- which number a given failure produces -- is left to the behaviour suite under
``SQLQUEUE_MSSQL_URI``.
"""

from __future__ import annotations

import pymssql
import pyodbc
import pytest
from pymssql import _mssql

from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.dialects import sqlserver as tsql
from airflow_provider_sqlqueue.transport.drivers import PymssqlSession, PyodbcSession
from airflow_provider_sqlqueue.transport.errors import (
    DuplicateMessageError,
    LockTimeoutError,
    ObjectExistsError,
    PermissionDeniedError,
    QueueNotFoundError,
    StatementRejectedError,
    StorageFullError,
    TransportMisconfiguredError,
    TransportUnavailableError,
)

dialect = get_dialect("sqlserver")
SERVER_TAIL = (
    b"DB-Lib error message 20018, severity 16:\nGeneral SQL Server error: Check messages from the SQL Server\n"
)


def pymssql_error(number: int, text: str, cls: type[Exception] = pymssql.exceptions.OperationalError) -> Exception:
    """As pymssql's Cursor.execute raises a server error: the DB-API class around (number, bytes)."""
    return cls((number, text.encode() + SERVER_TAIL))


def pyodbc_error(
    cls: type[Exception], sqlstate: str, text: str, native: int, function: str = "SQLExecDirectW"
) -> Exception:
    """As pyodbc raises it: (sqlstate, "[sqlstate] [driver][SQL Server]text (native) (function)")."""
    return cls(sqlstate, f"[{sqlstate}] [FreeTDS][SQL Server]{text} ({native}) ({function})")


CASES = [
    # pymssql: every one of these arrives as OperationalError; the number decides.
    (
        pymssql_error(257, "Implicit conversion from data type varchar to varbinary(max) is not allowed."),
        StatementRejectedError,
    ),
    (
        pymssql_error(1934, "INSERT failed because the following SET options have incorrect settings: 'ANSI_NULLS'."),
        StatementRejectedError,
    ),
    (pymssql_error(2714, "There is already an object named 'orders' in the database."), ObjectExistsError),
    (
        pymssql_error(
            1913, "The operation failed because an index or statistics with name 'Index_RowVersion' already exists."
        ),
        ObjectExistsError,
    ),
    (pymssql_error(517, "Adding a value to a 'datetime' column caused an overflow."), StatementRejectedError),
    (pymssql_error(8115, "Arithmetic overflow error converting expression to data type int."), StatementRejectedError),
    (pymssql_error(18456, "Login failed for user 'queue'."), TransportMisconfiguredError),
    (
        pymssql_error(911, "Database 'Shop' does not exist. Make sure that the name is entered correctly."),
        TransportMisconfiguredError,
    ),
    (pymssql_error(208, "Invalid object name 'dbo.orders'.", pymssql.exceptions.ProgrammingError), QueueNotFoundError),
    (
        pymssql_error(
            2627,
            "Violation of PRIMARY KEY constraint. The duplicate key value is (5).",
            pymssql.exceptions.IntegrityError,
        ),
        DuplicateMessageError,
    ),
    (pymssql_error(229, "The SELECT permission was denied on the object 'orders'."), PermissionDeniedError),
    (
        pymssql_error(1205, "Transaction was deadlocked on lock resources with another process."),
        TransportUnavailableError,
    ),
    (pymssql_error(1222, "Lock request time out period exceeded."), LockTimeoutError),
    (pymssql_error(3960, "Snapshot isolation transaction aborted due to update conflict."), TransportUnavailableError),
    (pymssql_error(40613, "Database 'queues' on server 'x' is not currently available."), TransportUnavailableError),
    (pymssql_error(tsql.ROLLED_BACK_NUMBER, tsql.ROLLED_BACK_TEXT), StatementRejectedError),
    # No space left: the server answers, only an operator can help (not "unavailable").
    (
        pymssql_error(
            1105,
            "Could not allocate space for object 'dbo.orders' in database 'queues' because the 'PRIMARY' "
            "filegroup is full.",
        ),
        StorageFullError,
    ),
    (pymssql_error(9002, "The transaction log for database 'queues' is full due to 'LOG_BACKUP'."), StorageFullError),
    # pymssql: FreeTDS DB-Lib's own numbers for a connection that failed or died.
    (
        pymssql.exceptions.OperationalError(
            (
                20009,
                b"DB-Lib error message 20009, severity 9:\nUnable to connect: Adaptive Server is unavailable or does not exist (db)\n",
            )
        ),
        TransportUnavailableError,
    ),
    (
        pymssql.exceptions.OperationalError(
            (20047, b"DB-Lib error message 20047, severity 9:\nDBPROCESS is dead or not enabled\n")
        ),
        TransportUnavailableError,
    ),
    (
        pymssql.exceptions.OperationalError(
            (20003, b"DB-Lib error message 20003, severity 6:\nAdaptive Server connection timed out (db)\n")
        ),
        TransportUnavailableError,
    ),
    (
        pymssql.exceptions.InterfaceError("Connection to the database failed for an unknown reason."),
        TransportUnavailableError,
    ),
    # _mssql's exception, as raised below the DB-API layer.
    (_mssql.MSSQLDatabaseException((18456, b"Login failed for user 'queue'.")), TransportMisconfiguredError),
    # pyodbc: the native number sits before the function name; other parenthesised numbers are text.
    (
        pyodbc_error(
            pyodbc.IntegrityError,
            "23000",
            "Violation of PRIMARY KEY constraint 'PK_orders(2)'. The duplicate key value is (5).",
            2627,
        ),
        DuplicateMessageError,
    ),
    (pyodbc_error(pyodbc.ProgrammingError, "42S02", "Invalid object name 'dbo.orders(2)'.", 208), QueueNotFoundError),
    (
        pyodbc_error(
            pyodbc.DataError,
            "22018",
            "Implicit conversion from data type varchar to varbinary(max) is not allowed. (1)",
            257,
        ),
        StatementRejectedError,
    ),
    (
        pyodbc_error(
            pyodbc.ProgrammingError, "42S01", "There is already an object named 'orders(1)' in the database.", 2714
        ),
        ObjectExistsError,
    ),
    (
        pyodbc_error(pyodbc.InterfaceError, "28000", "Login failed for user 'queue'.", 18456, "SQLDriverConnect"),
        TransportMisconfiguredError,
    ),
    (pyodbc_error(pyodbc.OperationalError, "08S01", "Communication link failure", 0), TransportUnavailableError),
    (
        pyodbc_error(pyodbc.OperationalError, "08001", "Unable to connect to data source", 20009, "SQLDriverConnect"),
        TransportUnavailableError,
    ),
    (pyodbc_error(pyodbc.OperationalError, "HYT00", "Query timeout expired", 0), TransportUnavailableError),
    (pyodbc_error(pyodbc.Error, "HY000", "Lock request time out period exceeded.", 1222), LockTimeoutError),
    (
        pyodbc_error(pyodbc.Error, "40001", "Transaction (Process ID 52) was deadlocked on lock resources (7).", 1205),
        TransportUnavailableError,
    ),
    (
        pyodbc_error(
            pyodbc.ProgrammingError, "42000", "The SELECT permission was denied on the object 'orders(3)'.", 229
        ),
        PermissionDeniedError,
    ),
]


@pytest.mark.parametrize(
    ("exc", "expected"), CASES, ids=[f"{type(e).__module__}.{type(e).__name__}-{n}" for n, (e, _) in enumerate(CASES)]
)
def test_driver_errors_are_classified_by_native_number(exc, expected):
    error = dialect.translate_error(exc, "[dbo].[orders]")
    assert type(error) is expected, (exc.args, error)


def test_native_numbers_come_from_where_each_driver_puts_them():
    tricky = pyodbc_error(pyodbc.IntegrityError, "23000", "key (5) in 'orders(2)' (7)", 2601)
    assert tsql.native_error(tricky).number == 2601
    assert tsql.native_error(pymssql_error(257, "conversion (12)")).number == 257


def test_permanent_errors_name_their_number_and_are_not_retry_later():
    error = dialect.translate_error(pymssql_error(257, "Implicit conversion ..."), "[dbo].[orders]")
    assert isinstance(error, StatementRejectedError) and error.number == 257
    assert not isinstance(error, TransportUnavailableError)
    assert "error 257" in str(error)


def test_errors_of_other_libraries_are_left_alone():
    assert dialect.translate_error(ValueError("not a driver error"), "[dbo].[orders]") is None


class _NotAutocommit:
    """A stand-in for a driver connection in manual-commit mode; the session refuses it before any statement."""

    autocommit_state = False
    autocommit = False

    def cursor(self) -> None:
        raise AssertionError("no statement may run on a refused connection")


@pytest.mark.parametrize("session_type", [PymssqlSession, PyodbcSession])
def test_a_borrowed_connection_that_does_not_autocommit_is_refused(session_type):
    with pytest.raises(TransportMisconfiguredError, match="not in autocommit mode"):
        session_type(_NotAutocommit())
