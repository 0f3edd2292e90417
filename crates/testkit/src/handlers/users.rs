//! User commands (31–37): accounts and their permissions, in the server's order of decode →
//! auth → permission → validation → lookup, which differs per command (e.g. DELETE_USER checks
//! `manage_users` before it looks the user up, CHANGE_PASSWORD looks the user up first because
//! changing one's own password needs no right).

use super::common::{no_fields, now_micros, Reply, Request};
use crate::users::{
    Action, Permissions, User, UserStatus, PASSWORD_LEN, ROOT_USER_ID, USERNAME_LEN,
};
use crate::wire::status;

pub(super) fn get_user(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.query(
        |r| r.ident(),
        |meta, me, id| {
            // `query_user`: an unknown name answers empty without a check; a numeric id is judged
            // before it is looked up; reading oneself needs no right.
            let Some(uid) = meta.users.resolve(id) else {
                return Ok(());
            };
            if uid != me {
                meta.users.check(me, Action::ReadUsers)?;
            }
            if let Some(user) = meta.users.get(uid) {
                user.encode_details(uid, out);
            }
            Ok(())
        },
    )
}

pub(super) fn get_users(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.query(no_fields, |meta, me, ()| {
        meta.users.check(me, Action::ReadUsers)?;
        for (id, user) in meta.users.iter() {
            user.encode_header(id, out);
        }
        Ok(())
    })
}

pub(super) fn create_user(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.change(
        |r| {
            Ok((
                r.name()?,
                r.short_str()?,
                r.u8()?,
                Permissions::decode_optional(r)?,
            ))
        },
        |meta, me, request| {
            let (username, password, status_code, permissions) = request;
            meta.users.check(me, Action::ManageUsers)?;
            if !USERNAME_LEN.contains(&username.len()) {
                return Err(status::INVALID_USERNAME);
            }
            if !PASSWORD_LEN.contains(&password.len()) {
                return Err(status::INVALID_PASSWORD);
            }
            let user = User {
                username: username.to_owned(),
                password: password.to_owned(),
                status: UserStatus::from_code(status_code)?,
                created_at: now_micros(),
                permissions,
            };
            let id = meta.users.create(user)?;
            if let Some(user) = meta.users.get(id) {
                user.encode_details(id, out);
            }
            Ok(())
        },
    )
}

pub(super) fn delete_user(req: Request<'_>) -> Reply {
    req.change(
        |r| r.ident(),
        |meta, me, id| {
            meta.users.check(me, Action::ManageUsers)?;
            let (uid, _) = meta.users.existing(id)?;
            if uid == ROOT_USER_ID {
                return Err(status::CANNOT_DELETE_USER);
            }
            req.shared.state.forget_clients_of_user(uid);
            meta.users.remove(uid);
            Ok(())
        },
    )
}

pub(super) fn update_user(req: Request<'_>) -> Reply {
    req.change(
        |r| {
            let id = r.ident()?;
            let username = if r.u8()? == 1 { Some(r.name()?) } else { None };
            let status = if r.u8()? == 1 { Some(r.u8()?) } else { None };
            Ok((id, username, status))
        },
        |meta, me, (id, username, status_code)| {
            meta.users.check(me, Action::ManageUsers)?;
            if username.is_some_and(|name| !USERNAME_LEN.contains(&name.len())) {
                return Err(status::INVALID_USERNAME);
            }
            let status = status_code.map(UserStatus::from_code).transpose()?;
            // Root may be renamed and even deactivated (which locks it out of new logins): the
            // server protects only its existence and its permissions.
            let (uid, _) = meta.users.existing(id)?;
            meta.users.update(uid, username, status)
        },
    )
}

pub(super) fn update_permissions(req: Request<'_>) -> Reply {
    req.change(
        |r| Ok((r.ident()?, Permissions::decode_optional(r)?)),
        |meta, me, (id, permissions)| {
            meta.users.check(me, Action::ManageUsers)?;
            let (uid, _) = meta.users.existing(id)?;
            if uid == ROOT_USER_ID {
                return Err(status::CANNOT_CHANGE_PERMISSIONS);
            }
            meta.users.set_permissions(uid, permissions)
        },
    )
}

pub(super) fn change_password(req: Request<'_>) -> Reply {
    req.change(
        |r| Ok((r.ident()?, r.short_str()?, r.short_str()?)),
        |meta, me, (id, current, new)| {
            if !PASSWORD_LEN.contains(&current.len()) || !PASSWORD_LEN.contains(&new.len()) {
                return Err(status::INVALID_PASSWORD);
            }
            let (uid, user) = meta.users.existing(id)?;
            if uid != me {
                meta.users.check(me, Action::ManageUsers)?;
            }
            if user.password != current {
                return Err(status::INVALID_CREDENTIALS);
            }
            meta.users.set_password(uid, new)
        },
    )
}
